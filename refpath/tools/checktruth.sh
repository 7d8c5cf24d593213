#!/bin/sh
# Validates truth files: every line is JSON, the last is the end line and its
# call count matches; every CUDA call line carries its integer "result". Calls
# fail only where the scenario means them to: failing-copies (4 copies with
# CUDA_ERROR_INVALID_VALUE 1, no engine times, the good copies timed) and
# no-device (every call cudaErrorNoDevice 100, the driver called once: the
# runtime's cuInit); elsewhere every result is 0. Every CUDA copy says what an
# observer must report of each side (expect_src_mem, expect_dst_mem): memory
# mapped or registered before the observer attached is "unknown" (late-attach
# has both pinned and pageable such memory, and pageable memory mapped after);
# replay's event queries may answer cudaErrorNotReady (600).
# vmm-pool-managed expects no side pageable, managed memory on some, and an
# unknown direction exactly where a Default copy has a managed side.
# Usage: checktruth.sh FILE...
exec python3 - "$@" <<'PY'
import json, re, sys

COPY_OPS = ("copy", "copy2d", "copy_peer", "copy_batch")
KINDS = ("pinned", "pageable", "device", "managed", "unknown")


def problems(calls, end):
    out = []
    sc = end.get("scenario")
    cuda = [c for c in calls if c["api"].startswith(("cu", "refcuda"))]
    for c in cuda:
        if not isinstance(c.get("result"), int):
            out.append("seq %s has no integer result" % c.get("seq"))
    failed = [c for c in cuda if c.get("result")]
    if sc == "replay":
        # cudaEventQuery's cudaErrorNotReady (600) is its answer, not a failure
        failed = [c for c in failed if not (c["op"] == "event_query" and c["result"] == 600)]
    copies = [c for c in cuda if c["op"] in COPY_OPS]
    for c in copies:
        if c.get("expect_src_mem") not in KINDS or c.get("expect_dst_mem") not in KINDS:
            out.append("seq %s: a copy must say what each side is expected to be" % c["seq"])
    if sc == "late-attach":
        host = [(c.get("host_mem"), c.get("expect_host_mem")) for c in copies if c["direction"] == "H2D"]
        for want in (("pinned", "unknown"), ("pageable", "unknown"), ("pageable", "pageable")):
            if want not in host:
                out.append("late-attach: no H2D copy from %s host memory expecting %s" % want)
        if ("pinned", "pinned") in host:
            out.append("late-attach: pinned memory registered before the attach expected pinned")
    if sc == "vmm-pool-managed":
        sides = [k for c in copies for k in (c.get("expect_src_mem"), c.get("expect_dst_mem"))]
        if "pageable" in sides or "unknown" in sides or "managed" not in sides:
            out.append("vmm-pool-managed: every side must be placed (device, pinned, managed), some managed")
        for c in copies:
            placed = c.get("kind") in (0, 4)
            managed = "managed" in (c.get("expect_src_mem"), c.get("expect_dst_mem"))
            if (c["direction"] == "unknown") != (placed and managed):
                out.append("seq %s: direction %s, kind %s" % (c["seq"], c["direction"], c.get("kind")))
    if sc == "failing-copies":
        if len(failed) != 4 or end.get("expected_errors") != 4:
            out.append("%d failed calls, expected 4" % len(failed))
        for c in failed:
            if c["op"] not in COPY_OPS or c["result"] != 1 or "engine_end_ns" in c or "direction" not in c:
                out.append("seq %s: a failed copy must be a copy with result 1, a direction and no engine times" % c["seq"])
        for c in cuda:
            if c["op"] in COPY_OPS and not c["result"] and "engine_end_ns" not in c:
                out.append("seq %s: a good copy without engine times" % c["seq"])
    elif sc == "no-device":
        if len(failed) != len(cuda) or any(c["result"] != 100 for c in cuda) or len(cuda) != 10:
            out.append("every one of the 10 calls must return 100")
        if [c["op"] for c in cuda].count("kernel_copy") != 1:
            out.append("one KV-transfer kernel launch must be refused")
        if not cuda or cuda[0]["api"] != "cudaGetDeviceCount":
            out.append("the first call must be cudaGetDeviceCount")
        if end.get("driver_calls") != 1 or end.get("init_error") != 100:
            out.append("the driver must be called once (cuInit -> 100), got %s" % end.get("driver_calls"))
        for c in cuda:
            # nothing could be registered, and the observer saw the process from its start
            if c["op"] in COPY_OPS and (c.get("expect_host_mem") not in ("pageable", "device") or "engine_end_ns" in c):
                out.append("seq %s: a refused copy must expect its unregistered host memory pageable, without engine times" % c["seq"])
    elif failed:
        out.append("%d calls failed (seq %s...)" % (len(failed), failed[0].get("seq")))
    if sc == "tp-workers":
        out += tp_worker_problems(calls, end)
    return out


def tp_worker_problems(calls, end):
    # a worker names the GPU of every copy (the parent makes no call); two devices
    # at least; rank 0 asked every device's PCI bus id, the others none
    out = []
    if "rank" not in end:
        return [] if not calls else ["the tp-workers parent made %d calls" % len(calls)]
    gpus = set()
    for c in calls:
        if c["op"] in COPY_OPS:
            g = c.get("gpu", "")
            if not re.fullmatch(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]", g):
                out.append("seq %s: copy without a PCI address in gpu (%r)" % (c["seq"], g))
            gpus.add(g)
    if len(gpus) < 2:
        out.append("copies on %d GPUs, want at least 2" % len(gpus))
    asked = sum(1 for c in calls if c["op"] == "device_pci_bus_id")
    if asked != (end.get("devices") if end.get("rank") == 0 else 0):
        out.append("rank %s asked %d bus ids" % (end.get("rank"), asked))
    return out


ok = True
for path in sys.argv[1:]:
    lines = [json.loads(l) for l in open(path) if l.strip()]
    end = lines[-1] if lines else {}
    calls = lines[:-1]
    copies = sum(1 for c in calls if c.get("op") in COPY_OPS)
    good = end.get("end") is True and end.get("calls") == len(calls) and all("api" in c and "op" in c for c in calls)
    probs = problems(calls, end) if good else []
    good &= not probs
    ok &= good
    print("%-48s %5d calls %5d copies %s" % (path, len(calls), copies, "ok" if good else "BAD"))
    for p in probs[:8]:
        print("    " + p)
sys.exit(0 if ok else 1)
PY
