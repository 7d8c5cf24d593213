package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// elfHeader writes a file holding only an ELF header of class and machine.
func elfHeader(t *testing.T, class elf.Class, machine elf.Machine, typ elf.Type) string {
	t.Helper()
	var b bytes.Buffer
	ident := [elf.EI_NIDENT]byte{0x7f, 'E', 'L', 'F', byte(class), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)}
	if class == elf.ELFCLASS64 {
		binary.Write(&b, binary.LittleEndian, elf.Header64{Ident: ident, Type: uint16(typ), Machine: uint16(machine),
			Version: uint32(elf.EV_CURRENT), Ehsize: 64})
	} else {
		binary.Write(&b, binary.LittleEndian, elf.Header32{Ident: ident, Type: uint16(typ), Machine: uint16(machine),
			Version: uint32(elf.EV_CURRENT), Ehsize: 52})
	}
	p := filepath.Join(t.TempDir(), "lib.so")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// procFixture is a procfs tree: kthreadd (pid 2) as this host's stat and
// status show it, and a process 40 whose thread 41 has its own entry.
func procFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	kthreadd, err := os.ReadFile(filepath.Join("..", "..", "collectors", "testdata", "stat", "lanewatch-dev_kthreadd.stat"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(pid int, stat, status string) {
		d := filepath.Join(dir, strconv.Itoa(pid))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o644)
		os.WriteFile(filepath.Join(d, "status"), []byte(status), 0o644)
	}
	write(2, string(kthreadd), "Name:\tkthreadd\nTgid:\t2\nPid:\t2\n")
	user := "40 (python3) S 1 40 40 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 2 0 900 0 0 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
	write(40, user, "Name:\tpython3\nTgid:\t40\nPid:\t40\n")
	write(41, strings.Replace(user, "40 (python3)", "41 (python3)", 1), "Name:\tpython3\nTgid:\t40\nPid:\t41\n")
	return dir
}

// Flags that say no (issue 13): each bad value is an error naming the flag,
// with exit 2, before anything starts; -h is an answer, exit 0.
func TestFlagsSayNo(t *testing.T) {
	proc := procFixture(t)
	text := filepath.Join(t.TempDir(), "notes.so")
	os.WriteFile(text, []byte("not a library\n"), 0o644)
	arm := elfHeader(t, elf.ELFCLASS64, elf.EM_AARCH64, elf.ET_DYN)
	i386 := elfHeader(t, elf.ELFCLASS32, elf.EM_386, elf.ET_DYN)
	object := elfHeader(t, elf.ELFCLASS64, elf.EM_X86_64, elf.ET_REL)
	pidMax, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(pidMax)))
	gone := strconv.Itoa(n + 1) // above pid_max: no process can have it
	off := []string{"--web.listen-address", "", "--otlp.grpc-listen", "", "--otlp.http-listen", ""}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--pid", gone}, "agent run: --pid " + gone + ": no such process (no /proc/" + gone + ")"},
		{[]string{"run", "--path.procfs", proc, "--pid", "2"}, "agent run: --pid 2: kthreadd is a kernel thread: it maps no library to probe"},
		{[]string{"run", "--path.procfs", proc, "--pid", "41"}, "agent run: --pid 41: a thread of process 40 (python3): give the process"},
		{[]string{"run", "--path.procfs", ""}, "agent run: --path.procfs is empty"},
		{[]string{"run", "--path.sysfs", text}, "agent run: --path.sysfs " + text + ": not a directory"},
		{[]string{"run", "--path.rootfs", text}, "agent run: --path.rootfs " + text + ": not a directory"},
		{[]string{"run", "--path.rootfs", ""}, "agent run: --path.rootfs is empty"},
		{[]string{"run", "--lib", text}, "agent run: --lib " + text + ": not an ELF file (it starts with \"not \")"},
		{[]string{"run", "--lib", arm}, "agent run: --lib " + arm + ": an ELF file for EM_AARCH64 (ELFCLASS64); the probes are built for x86-64"},
		{[]string{"run", "--lib", i386}, "agent run: --lib " + i386 + ": an ELF file for EM_386 (ELFCLASS32)"},
		{[]string{"run", "--lib", object}, "agent run: --lib " + object + ": an ELF ET_REL, not a shared library or executable"},
		{[]string{"run", "--lib", "/no/such.so"}, "agent run: --lib /no/such.so: open /no/such.so: no such file or directory"},
		{[]string{"run", "--ring-bytes", "4294967296"}, "agent run: --ring-bytes 4294967296: want a power of two"},
		{[]string{"run", "--ring-bytes", "3000000"}, "agent run: --ring-bytes 3000000: want a power of two"},
		{[]string{"run", "--ring-bytes", "1024"}, "agent run: --ring-bytes 1024: want a power of two from"},
		{[]string{"run", "--rescan-interval", "-1s"}, "agent run: --rescan-interval -1s: must be positive"},
		{[]string{"run", "--evaluate-interval", "0s"}, "agent run: --evaluate-interval 0s: must be positive"},
		{[]string{"run", "--spans.hold", "-5s"}, "agent run: --spans.hold -5s: must be positive"},
		// 0 would have become the exporter's 15 s default, silently.
		{[]string{"run", "--spans.hold", "0"}, "agent run: --spans.hold 0s: must be positive"},
		{[]string{"run", "--spans.max-hold", "0"}, "agent run: --spans.max-hold 0s: must be positive"},
		{[]string{"run", "--otlp.index-max-spans", "-1"}, "agent run: --otlp.index-max-spans -1: must not be negative"},
		{[]string{"run", "--otlp.index-max-bytes", "0"}, "agent run: --otlp.index-max-bytes 0: must be positive"},
		{[]string{"run", "--otlp.index-max-bytes", "off"}, "agent run: --otlp.index-max-bytes off: needs --otlp.index-max-spans"},
		{[]string{"run", "--otlp.index-max-bytes", "5G"}, `agent run: --otlp.index-max-bytes "5G": unit "G" is not B, KiB, MiB, GiB or TiB`},
		{[]string{"run", "--ready.max-drop-ratio", "0"}, "agent run: --ready.max-drop-ratio 0: must be in (0, 1]"},
		{[]string{"run", "--ready.max-drop-ratio", "1.5"}, "agent run: --ready.max-drop-ratio 1.5: must be in (0, 1]"},
		{[]string{"run", "--ready.max-drop-ratio", "NaN"}, "agent run: --ready.max-drop-ratio NaN: must be in (0, 1]"},
		{[]string{"run", "--memory-limit", "10MiB"}, "agent run: --memory-limit 10485760: leaves the Go heap"},
		{[]string{"run", "--otlp.max-body", "12"}, "agent run: --otlp.max-body 12: want from 1KiB to 2GiB"},
		{[]string{"run", "--otlp.max-body", "8M"}, `agent run: --otlp.max-body "8M": unit "M" is not B`},
		{[]string{"run", "--otlp.max-concurrent", "0"}, "agent run: --otlp.max-concurrent 0: must be positive"},
		{[]string{"run", "--otlp.max-connections", "-3"}, "agent run: --otlp.max-connections -3: must be positive"},
		{[]string{"run", "--otlp.read-timeout", "0s"}, "agent run: --otlp.read-timeout 0s: must be positive"},
		{[]string{"run", "--memory-limit", "1G"}, `agent run: --memory-limit "1G": unit "G" is not B, KiB, MiB, GiB or TiB`},
		{[]string{"diagnose", "--sample", "-5s"}, "agent diagnose: --sample -5s: must not be negative"},
		{[]string{"diagnose", "--pid", gone}, "agent diagnose: --pid " + gone + ": no such process"},
		{[]string{"diagnose", "--lib", text}, "agent diagnose: --lib " + text + ": not an ELF file"},
		{[]string{"diagnose", "--path.sysfs", ""}, "agent diagnose: --path.sysfs is empty"},
		{[]string{"topo", "--path.sysfs", "/no/such/dir"}, "agent topo: --path.sysfs: stat /no/such/dir: no such file or directory"},
		{[]string{"top", "--interval", "0s"}, "agent top: --interval 0s: must be positive"},
		{[]string{"top", "--web.listen-address", ""}, "agent top: --web.listen-address is empty: the agent serves no metrics to read"},
		{[]string{"top", "--web.listen-address", "localhost"}, "agent top: --web.listen-address localhost: address localhost: missing port in address"},
	} {
		var out, errb bytes.Buffer
		args := append(tc.args, off...)
		if tc.args[0] != "run" {
			args = tc.args
		}
		if code := realMain(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
	// A request of --otlp.max-body must fit the receivers' decode budget,
	// a quarter of --memory-limit (checked only with a receiver on).
	var out, errb bytes.Buffer
	if code := realMain([]string{"run", "--memory-limit", "256MiB", "--otlp.max-body", "8MiB", "--otlp.grpc-listen", "127.0.0.1:0",
		"--otlp.http-listen", "", "--web.listen-address", ""}, &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), "agent run: --otlp.max-body 8388608: a request that size may take 83886080 bytes to decode, more than the receivers' budget of 67108864") {
		t.Errorf("max-body over the budget: exit %d, stderr %q", code, errb.String())
	}
	// Every error at once.
	out.Reset()
	errb.Reset()
	if code := realMain(append([]string{"run", "--lib", text, "--ring-bytes", "5", "--spans.hold", "-1s"}, off...), &out, &errb); code != 2 ||
		strings.Count(errb.String(), "agent run: ") != 3 {
		t.Errorf("three bad flags: exit %d, stderr %q", code, errb.String())
	}
	for _, cmd := range []string{"run", "diagnose", "topo", "top", "selftest", "probes"} {
		var out, errb bytes.Buffer
		if code := realMain([]string{cmd, "-h"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "Usage: agent "+cmd) {
			t.Errorf("%s -h: exit %d, stderr %q", cmd, code, errb.String())
		}
	}
}

func TestCheckRing(t *testing.T) {
	page := uint(os.Getpagesize())
	for _, ok := range []uint{0, page, 4 << 20, 64 << 20, maxRingBytes} {
		if err := checkRing(ok); err != nil {
			t.Errorf("%d: %v", ok, err)
		}
	}
	for _, bad := range []uint{1, page / 2, page + 1, 3 << 20, maxRingBytes * 2, 1 << 32, 1<<32 + 4096} {
		if err := checkRing(bad); err == nil {
			t.Errorf("%d accepted", bad)
		}
	}
}

// --pid on this host's own processes: this one passes, a thread of it is
// refused.
func TestCheckPIDsLive(t *testing.T) {
	if err := checkPIDs("/proc", []int{os.Getpid()}); err != nil {
		t.Errorf("this process: %v", err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if tid, _ := strconv.Atoi(task.Name()); tid != os.Getpid() {
			if err := checkPIDs("/proc", []int{tid}); err == nil || !strings.Contains(err.Error(), "a thread of process "+strconv.Itoa(os.Getpid())) {
				t.Errorf("thread %d: %v", tid, err)
			}
			return
		}
	}
	t.Fatal("no second thread in this Go process")
}
