#!/bin/sh
# Every exported cu*/cuda* function of the given libraries must open with
# push %rbp (after endbr64 in a CET build): the instruction the agent probes,
# which the kernel emulates instead of single-stepping. Usage: checkprologues.sh LIB...
bad=0
for lib in "$@"; do
	out=$(objdump -d --no-show-raw-insn "$lib" | awk '
		/^[0-9a-f]+ <cu[A-Za-z0-9_]*>:$/ { name = $2; n = 0; next }
		name != "" && /^ *[0-9a-f]+:/ {
			sub(/^ *[0-9a-f]+:[ \t]*/, ""); gsub(/[ \t]+/, " ")
			if ($0 ~ /^endbr64/ && n == 0) { n = 1; next }
			if ($0 !~ /^push %rbp/) print name, $0
			name = ""
		}')
	if [ -n "$out" ]; then
		echo "$lib: entry points that do not open with push %rbp:"; echo "$out"; bad=1
	fi
	# exported functions only: a dynamic symbol list that names them all
	n=$(nm -D --defined-only "$lib" | awk '$2 == "T" && $3 ~ /^cu/' | wc -l)
	echo "$lib: $n cu* entry points checked"
done
exit $bad
