#!/bin/sh
# Validates truth files: every line is JSON, the last is the end line and its
# call count matches. Usage: checktruth.sh FILE...
exec python3 - "$@" <<'PY'
import json, sys
ok = True
for path in sys.argv[1:]:
    lines = [json.loads(l) for l in open(path) if l.strip()]
    end = lines[-1] if lines else {}
    calls = lines[:-1]
    copies = sum(1 for c in calls if c.get("op") in ("copy", "copy2d", "copy_peer", "copy_batch"))
    good = end.get("end") is True and end.get("calls") == len(calls) and all("api" in c and "op" in c for c in calls)
    ok &= good
    print("%-48s %5d calls %5d copies %s" % (path, len(calls), copies, "ok" if good else "BAD"))
sys.exit(0 if ok else 1)
PY
