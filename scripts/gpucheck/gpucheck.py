#!/usr/bin/env python3
"""gpucheck: prove lanewatch's probes on a real NVIDIA GPU with PyTorch.

Runs pinned and pageable H2D and D2H copies of known sizes under `agent run`
and checks that every copy was traced with the right host memory kind, that the
GPU's PCIe byte counters (NVML, when the GPU has them) agree with the bytes
copied within 10%, and prints the achieved GB/s next to the link's capacity.

Everything except run_gpu() and its helpers is pure and tested without a GPU
(test_gpucheck.py). torch is imported only when the check runs.
"""

import argparse
import ctypes
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

EXIT_OK = 0  # every check passed
EXIT_FAIL = 1  # at least one check failed
EXIT_USAGE = 2  # bad arguments
EXIT_ENV = 3  # the check could not run: no torch, no GPU, no agent, time budget

MAX_TIMEOUT_S = 290  # the check promises to finish in under five minutes
STOP_RESERVE_S = 25  # kept at the end of the budget to stop the agent and read its records
COUNTER_TOLERANCE = 0.10
DIRECTIONS = ("H2D", "D2H")
KINDS = ("pinned", "pageable")

HELP_EPILOG = """\
what it does:
  1. imports torch, initialises CUDA on --device;
  2. starts `AGENT run --pid <this process> --output <temp file>` (as root: through
     `sudo -n` when not root) with metrics and OTLP listeners off, and waits for
     "lanewatch running";
  3. for H2D then D2H, pinned then pageable, each size: one warm-up copy, then
     --repeats copies (tensor.copy_(..., non_blocking=True)) between two CUDA events,
     reading the GPU's PCIe byte counters (NVML field values 197/198 through
     libnvidia-ml.so.1) before and after;
  4. stops the agent with SIGINT and matches its records to the copies by direction,
     size and time window (CLOCK_MONOTONIC, as the probes'); the link's capacity
     comes from sysfs, NVML or nvidia-smi, read while copies keep the link busy.

checks (each failure is listed, exit 1):
  - every copy traced: records per case == copies made, bytes == bytes copied
  - memory kind: host_mem is "pinned" for pinned copies, "pageable" for pageable
  - counters: per direction, PCIe counter bytes within 10% of the bytes copied
    (RX for H2D, TX for D2H); "counters unavailable" when the GPU has none

output: progress on stderr, then a table last on stdout (case, size, count
traced/expected, memory kind ok, GB/s, % of link) with a final PASS/FAIL line;
--json prints one JSON object instead of the table.

exit status: 0 pass, 1 a check failed, 2 bad arguments, 3 could not run (no
torch or CUDA, agent missing or not starting, time budget exceeded).

example:
  go build -o bin/agent ./cmd/agent
  sudo -E env PATH="$PATH" python3 scripts/gpucheck/gpucheck.py --sizes 4M,64M,256M --repeats 5
"""


class UsageError(ValueError):
    """Bad arguments: exit 2 with the message."""


class EnvError(RuntimeError):
    """The check cannot run here: exit 3 with the message (one line, no traceback)."""


# ---------------------------------------------------------------- sizes

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
MAX_SIZE = 16 << 30


def parse_size(text):
    """'4M' -> 4194304. Binary units K, M, G (an optional 'B' or 'iB' after them);
    a bare number is bytes. Raises UsageError on anything else."""
    m = _SIZE_RE.match(text or "")
    if not m:
        raise UsageError(
            f"bad size {text!r}: want a positive integer with an optional K, M or G suffix "
            "(binary: 4M = 4 MiB), e.g. 4M,64M,256M")
    n = int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if n <= 0:
        raise UsageError(f"bad size {text!r}: must be more than 0 bytes")
    if n > MAX_SIZE:
        raise UsageError(f"bad size {text!r}: at most {format_size(MAX_SIZE)}")
    return n


def parse_sizes(text):
    """'4M,64M,256M' -> sorted sizes in bytes; empty items and duplicates are errors."""
    items = (text or "").split(",")
    sizes = [parse_size(s) for s in items]
    dup = [format_size(s) for s, c in Counter(sizes).items() if c > 1]
    if dup:
        raise UsageError(f"bad sizes {text!r}: {', '.join(dup)} given twice")
    return sorted(sizes)


def format_size(n):
    """4194304 -> '4 MiB'; sizes that are not whole units keep their bytes."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def parse_device(text):
    """'cuda:1' or '1' -> 1."""
    m = re.match(r"^(?:cuda:)?(\d+)$", (text or "").strip())
    if not m:
        raise UsageError(f"bad device {text!r}: want an index such as 0 or cuda:0")
    return int(m.group(1))


# ---------------------------------------------------------------- link capacity

# GT/s per lane and line-code efficiency: 8b/10b for Gen1-2, 128b/130b for
# Gen3-5, FLIT mode (242 useful bytes of 256) for Gen6.
PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}
PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)


def link_capacity(gen, width):
    """Bytes/s per direction of a PCIe link: Gen5 x16 = 63.02e9."""
    if gen not in PCIE_GT_PER_S:
        raise ValueError(f"unknown PCIe generation {gen!r}")
    if width not in PCIE_WIDTHS:
        raise ValueError(f"unknown PCIe link width x{width!r}")
    return PCIE_GT_PER_S[gen] * 1e9 * width * PCIE_ENCODING[gen] / 8


def gen_from_speed(text):
    """sysfs current_link_speed '32.0 GT/s PCIe' -> 5; None when not a known speed."""
    m = re.match(r"^\s*([\d.]+)\s*GT/s", text or "")
    if not m:
        return None
    gts = float(m.group(1))
    for gen, rate in PCIE_GT_PER_S.items():
        if abs(rate - gts) < 0.01:
            return gen
    return None


def _int_or_none(text):
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def parse_sysfs_link(speed, width, max_speed=None, max_width=None):
    """sysfs current_link_speed/_width (and max_*) -> link dict, or None if unreadable."""
    gen, w = gen_from_speed(speed), _int_or_none(width)
    if gen is None or w is None:
        return None
    return {"gen": gen, "width": w, "max_gen": gen_from_speed(max_speed),
            "max_width": _int_or_none(max_width)}


NVIDIA_SMI_LINK_QUERY = ("pci.bus_id,pcie.link.gen.current,pcie.link.width.current,"
                         "pcie.link.gen.max,pcie.link.width.max")


def parse_nvidia_smi_link(line):
    """One line of `nvidia-smi --query-gpu=NVIDIA_SMI_LINK_QUERY --format=csv,noheader,nounits`."""
    parts = [p.strip() for p in (line or "").split(",")]
    if len(parts) != 5:
        return None
    gen, width = _int_or_none(parts[1]), _int_or_none(parts[2])
    if gen is None or width is None:
        return None
    return {"bdf": normalize_bdf(parts[0]), "gen": gen, "width": width,
            "max_gen": _int_or_none(parts[3]), "max_width": _int_or_none(parts[4])}


def normalize_bdf(text):
    """'00000000:17:00.0' (nvidia-smi, NVML) -> '0000:17:00.0' (sysfs); lower case."""
    m = re.match(r"^\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*$", text or "")
    if not m:
        return None
    dom = int(m.group(1) or "0", 16)
    return f"{dom:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def describe_link(link):
    """'PCIe Gen5 x16 = 63.02 GB/s per direction (sysfs)'."""
    if not link:
        return "link capacity unknown (no sysfs, NVML or nvidia-smi reading)"
    try:
        cap = f"{link_capacity(link['gen'], link['width']) / 1e9:.2f} GB/s per direction"
    except ValueError as e:
        cap = f"capacity unknown ({e})"
    s = f"PCIe Gen{link['gen']} x{link['width']} = {cap} ({link.get('source', '?')})"
    mg, mw = link.get("max_gen"), link.get("max_width")
    if mg and mw and (mg, mw) != (link["gen"], link["width"]):
        s += f"; trained below its maximum Gen{mg} x{mw}"
    return s


# ---------------------------------------------------------------- cases and records

@dataclass
class Case:
    """One run of `count` copies of `size` bytes in one direction from one kind of
    host memory, between start_ns and end_ns (CLOCK_MONOTONIC)."""
    direction: str
    kind: str
    size: int
    count: int
    start_ns: int = 0
    end_ns: int = 0
    seconds: float = None  # GPU time of the copies (CUDA events)
    counter_bytes: int = None  # PCIe counter delta in this direction, None if unavailable

    @property
    def name(self):
        return f"{self.direction} {self.kind}"

    @property
    def expected_bytes(self):
        return self.size * self.count

    @property
    def gbps(self):
        if not self.seconds or self.seconds <= 0:
            return None
        return self.expected_bytes / self.seconds / 1e9


def plan_cases(sizes, repeats):
    """H2D then D2H, pinned then pageable, sizes ascending."""
    return [Case(d, k, s, repeats) for d in DIRECTIONS for k in KINDS for s in sizes]


def estimate_seconds(sizes, repeats, floor_bytes_per_s=1e9):
    """A pessimistic copy time (pageable copies at 1 GB/s, warm-ups and the link
    reading included) for refusing plans that cannot fit the time budget."""
    total = sum(sizes) * (repeats + 1) * len(DIRECTIONS) * len(KINDS) + 8 * max(sizes)
    return total / floor_bytes_per_s


def load_records(lines):
    """The agent's JSONL -> list of dicts. Raises ValueError naming the bad line."""
    out = []
    for i, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"agent output line {i} is not JSON: {e}") from None
        if isinstance(rec, dict):
            out.append(rec)
    return out


def record_host_mem(rec):
    """host_mem, or the host side's memory for records without it."""
    if rec.get("host_mem"):
        return rec["host_mem"]
    side = {"H2D": "src", "D2H": "dst"}.get(rec.get("direction"))
    return ((rec.get(side) or {}).get("memory") if side else None) or "none"


@dataclass
class CaseResult:
    case: Case
    traced: int = 0  # records of the case's direction and size in its window
    traced_bytes: int = 0
    kinds: Counter = field(default_factory=Counter)  # host_mem of those records
    other_in_window: int = 0  # same direction, other sizes (torch's own copies, split copies)

    @property
    def count_ok(self):
        return self.traced == self.case.count and self.traced_bytes == self.case.expected_bytes

    @property
    def kind_ok(self):
        return self.traced > 0 and set(self.kinds) == {self.case.kind}


def match_records(cases, records, pid=None):
    """Per case, the agent's records of the case's direction submitted inside its
    window (and of pid, when given): those of the case's size are its copies."""
    results = [CaseResult(c) for c in cases]
    for rec in records:
        if pid is not None and rec.get("pid") != pid:
            continue
        submit = rec.get("submit_ns")
        if not isinstance(submit, int):
            continue
        for r in results:
            c = r.case
            if rec.get("direction") != c.direction or not c.start_ns <= submit <= c.end_ns:
                continue
            if rec.get("bytes") == c.size:
                r.traced += 1
                r.traced_bytes += rec["bytes"]
                r.kinds[record_host_mem(rec)] += 1
            else:
                r.other_in_window += 1
    return results


def unmatched_copies(results, records, pid=None):
    """Host<->device records of pid outside every case window (warm-ups, link reading)."""
    n = 0
    for rec in records:
        if pid is not None and rec.get("pid") != pid:
            continue
        if rec.get("direction") not in DIRECTIONS:
            continue
        s = rec.get("submit_ns")
        if not any(isinstance(s, int) and r.case.start_ns <= s <= r.case.end_ns for r in results):
            n += 1
    return n


# ---------------------------------------------------------------- counters

def counter_delta(before, after, bits=64):
    """after - before of a monotonic counter that may wrap at 2**bits."""
    if before is None or after is None:
        return None
    return (after - before) % (1 << bits)


def check_counters(cases, tolerance=COUNTER_TOLERANCE):
    """Per direction: bytes copied vs the PCIe counter bytes (RX for H2D, TX for
    D2H) summed over the cases; None for a direction without counters."""
    out = []
    for d in DIRECTIONS:
        cs = [c for c in cases if c.direction == d]
        if not cs:
            continue
        copied = sum(c.expected_bytes for c in cs)
        if any(c.counter_bytes is None for c in cs):
            out.append({"direction": d, "copied_bytes": copied, "counter_bytes": None,
                        "ratio": None, "ok": None})
            continue
        counted = sum(c.counter_bytes for c in cs)
        ratio = counted / copied if copied else None
        ok = ratio is not None and abs(ratio - 1) <= tolerance
        out.append({"direction": d, "copied_bytes": copied, "counter_bytes": counted,
                    "ratio": ratio, "ok": ok})
    return out


# ---------------------------------------------------------------- verdict and output

def pct_of_link(gbps, link):
    if gbps is None or not link:
        return None
    try:
        return 100 * gbps * 1e9 / link_capacity(link["gen"], link["width"])
    except ValueError:
        return None


def build_report(results, link=None, counters=None, counter_reason=None, agent=None, notes=None):
    """Everything the check found, as one JSON-able dict with failures listed."""
    failures = []
    rows = []
    for r in results:
        c = r.case
        if not r.count_ok:
            failures.append(f"{c.name} {format_size(c.size)}: traced {r.traced}/{c.count} copies, "
                            f"{r.traced_bytes}/{c.expected_bytes} bytes")
        if r.traced and not r.kind_ok:
            got = ", ".join(f"{k}×{n}" for k, n in sorted(r.kinds.items()))
            failures.append(f"{c.name} {format_size(c.size)}: host_mem should be {c.kind}, got {got}")
        gbps = c.gbps
        rows.append({"case": c.name, "direction": c.direction, "kind": c.kind, "size": c.size,
                     "expected": c.count, "traced": r.traced, "expected_bytes": c.expected_bytes,
                     "traced_bytes": r.traced_bytes, "kinds": dict(r.kinds), "count_ok": r.count_ok,
                     "kind_ok": r.kind_ok, "other_in_window": r.other_in_window,
                     "seconds": c.seconds, "gbps": gbps, "pct_link": pct_of_link(gbps, link),
                     "counter_bytes": c.counter_bytes})
    counters = counters or []
    for cc in counters:
        if cc["ok"] is False:
            failures.append(f"{cc['direction']} PCIe counter bytes {cc['counter_bytes']} are "
                            f"{100 * (cc['ratio'] - 1):+.1f}% off the {cc['copied_bytes']} bytes copied "
                            f"(tolerance ±{100 * COUNTER_TOLERANCE:.0f}%)")
    available = bool(counters) and all(cc["ok"] is not None for cc in counters)
    link_out = None
    if link:
        link_out = dict(link)
        try:
            link_out["capacity_gbps"] = round(link_capacity(link["gen"], link["width"]) / 1e9, 2)
        except ValueError:
            link_out["capacity_gbps"] = None
    return {"ok": not failures, "failures": failures, "notes": list(notes or []),
            "link": link_out, "counters": {"available": available,
                                           "reason": None if available else (counter_reason or "counters unavailable"),
                                           "directions": counters},
            "agent": agent or {}, "cases": rows}


def exit_code(report):
    return EXIT_OK if report["ok"] else EXIT_FAIL


TABLE_COLUMNS = (("case", 13), ("size", 9), ("traced", 9), ("kind ok", 8), ("GB/s", 8), ("% link", 7))


def _row(cells):
    out = []
    for (name, width), cell in zip(TABLE_COLUMNS, cells):
        right = name in ("GB/s", "% link", "traced")
        out.append(cell.rjust(width) if right else cell.ljust(width))
    return "  ".join(out).rstrip()


def format_table(report):
    """The table that is printed last: one row per case, then PASS/FAIL."""
    lines = [_row([n for n, _ in TABLE_COLUMNS])]
    for r in report["cases"]:
        gbps = "-" if r["gbps"] is None else f"{r['gbps']:.2f}"
        pct = "-" if r["pct_link"] is None else f"{r['pct_link']:.1f}%"
        lines.append(_row([r["case"], format_size(r["size"]), f"{r['traced']}/{r['expected']}",
                           "yes" if r["kind_ok"] else "no", gbps, pct]))
    if report["ok"]:
        lines.append("PASS: every copy traced with the right memory kind"
                     + ("; counters agree" if report["counters"]["available"] else ""))
    else:
        lines.append(f"FAIL: {len(report['failures'])} check(s) failed (listed above)")
    return "\n".join(lines)


def format_report(report):
    """Failures, notes, link and counters first; the table last."""
    lines = []
    for f in report["failures"]:
        lines.append(f"FAIL  {f}")
    for n in report["notes"]:
        lines.append(f"note  {n}")
    lines.append("link: " + describe_link(report["link"]))
    ctr = report["counters"]
    if not ctr["available"]:
        lines.append(f"counters: {ctr['reason']}")
    for cc in ctr["directions"]:
        if cc["ok"] is None:
            continue
        lines.append(f"counters {cc['direction']}: {cc['counter_bytes']} bytes for {cc['copied_bytes']} copied "
                     f"({100 * (cc['ratio'] - 1):+.1f}%, {'ok' if cc['ok'] else 'FAIL'})")
    lines.append("")
    lines.append(format_table(report))
    return "\n".join(lines)


# ---------------------------------------------------------------- arguments

def build_parser():
    p = argparse.ArgumentParser(
        prog="gpucheck.py",
        description="Check lanewatch on a host with an NVIDIA GPU and PyTorch: pinned and pageable "
                    "H2D/D2H copies of known sizes under `agent run`, every copy traced with the right "
                    "memory kind, PCIe counters within 10% of the bytes copied, achieved GB/s next to "
                    "the link's capacity. Finishes in under five minutes.",
        epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", default="./bin/agent", metavar="PATH",
                   help="the lanewatch agent binary (default: %(default)s; build it with "
                        "`go build -o bin/agent ./cmd/agent`)")
    p.add_argument("--agent-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for `agent run` (repeatable), e.g. --agent-arg=--log.level=debug")
    p.add_argument("--sizes", default="4M,64M,256M",
                   help="copy sizes, comma-separated, binary units K/M/G (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, metavar="N",
                   help="timed copies per case, after one warm-up (default: %(default)s)")
    p.add_argument("--device", default="cuda:0", help="CUDA device, N or cuda:N (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=240, metavar="SECONDS",
                   help=f"time budget for the whole check, at most {MAX_TIMEOUT_S} "
                        "(default: %(default)s); exceeding it stops the agent and exits 3")
    p.add_argument("--records", metavar="FILE",
                   help="keep the agent's JSONL records here (default: a temporary file, removed)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p


def parse_args(argv):
    """argparse plus the checks argparse cannot do; raises UsageError."""
    p = build_parser()
    args = p.parse_args(argv)
    args.size_list = parse_sizes(args.sizes)
    args.device_index = parse_device(args.device)
    if not 1 <= args.repeats <= 1000:
        raise UsageError(f"--repeats {args.repeats}: want 1 to 1000")
    if not 10 <= args.timeout <= MAX_TIMEOUT_S:
        raise UsageError(f"--timeout {args.timeout:g}: want 10 to {MAX_TIMEOUT_S} seconds "
                         "(the check must finish in under five minutes)")
    est = estimate_seconds(args.size_list, args.repeats)
    if est > args.timeout - STOP_RESERVE_S - 15:
        raise UsageError(f"--sizes {args.sizes} × --repeats {args.repeats} may need {est:.0f} s of copies "
                         f"at 1 GB/s, more than --timeout {args.timeout:g} leaves: use fewer or smaller copies")
    return args


# ---------------------------------------------------------------- the GPU part

def log(msg):
    print(f"gpucheck: {msg}", file=sys.stderr, flush=True)


def import_torch():
    try:
        import torch  # noqa: PLC0415 (lazy: --help and the tests run without it)
    except Exception as e:  # ImportError, or a broken install raising anything else
        raise EnvError(f"PyTorch is not importable ({type(e).__name__}: {e}); this check needs a host "
                       "with an NVIDIA GPU and PyTorch (pip install torch)") from None
    return torch


RUNNING_AGENTS = []  # for the watchdog: stopped before a hard exit


class Agent:
    """`agent run` as a child process, its log read by a thread."""

    def __init__(self, path, output, pid, extra):
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            raise EnvError(f"agent binary {path} not found or not executable: build it with "
                           "`go build -o bin/agent ./cmd/agent` or pass --agent")
        cmd = [os.path.abspath(path), "run", "--pid", str(pid), "--output", output,
               "--web.listen-address", "", "--otlp.grpc-listen", "", "--otlp.http-listen", "",
               "--spans", "off", *extra]
        if os.geteuid() != 0:
            cmd = ["sudo", "-n", "--", *cmd]
        self.cmd = cmd
        self.lines = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace")
        RUNNING_AGENTS.append(self)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if "lanewatch running" in line:
                self.ready.set()

    def tail(self, n=5):
        return " | ".join(self.lines[-n:]) or "(no log)"

    def wait_ready(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.ready.wait(0.1):
                return
            if self.proc.poll() is not None:
                self.reader.join(1)
                raise EnvError(f"agent exited ({self.proc.returncode}) before running "
                               f"(root needed; `sudo -n` when not root): {self.tail()}")
        raise EnvError(f"agent not running after {timeout:.0f} s: {self.tail()}")

    def attached(self):
        return [m.group(1) for m in (re.search(r"msg=attached path=(\S+)", l) for l in self.lines) if m]

    def stop(self, timeout):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise EnvError(f"agent did not stop within {timeout:.0f} s of SIGINT: {self.tail()}") from None
        self.reader.join(2)
        return self.proc.returncode

    def summary(self):
        """drops= and transfers= of the agent's summary line."""
        for line in reversed(self.lines):
            if "msg=summary" in line:
                return {k: int(v) for k, v in re.findall(r"\b(drops|transfers|events|ring_full)=(\d+)", line)}
        return {}


class _FieldValue(ctypes.Structure):
    # nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value (union, 8 bytes)
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_uint),
                ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_char * 8)]


NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198


def decode_field_value(value_type, raw):
    """An nvmlValue_t union by its nvmlValueType_t -> (number, wrap bits)."""
    fmt = {0: ("<d", 64), 1: ("<I", 32), 2: ("<Q", 64), 3: ("<Q", 64), 4: ("<q", 64), 5: ("<i", 32)}.get(value_type)
    if fmt is None:
        return None, 64
    size = struct.calcsize(fmt[0])
    return struct.unpack(fmt[0], bytes(raw)[:size])[0], fmt[1]


class Nvml:
    """Just what the check needs from libnvidia-ml.so.1, through ctypes."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            raise EnvError(f"libnvidia-ml.so.1 not loadable ({e})") from None
        rc = self.lib.nvmlInit_v2()
        if rc != 0:
            raise EnvError(f"nvmlInit_v2 returned {rc}")

    def handle(self, bdf):
        h = ctypes.c_void_p()
        rc = self.lib.nvmlDeviceGetHandleByPciBusId_v2(bdf.encode(), ctypes.byref(h))
        if rc != 0:
            raise EnvError(f"NVML has no GPU at {bdf} ({rc})")
        return h

    def pcie_bytes(self, h):
        """(tx, rx, bits) monotonic byte counters, or raises EnvError."""
        vals = (_FieldValue * 2)()
        vals[0].fieldId, vals[1].fieldId = NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES
        rc = self.lib.nvmlDeviceGetFieldValues(h, 2, vals)
        if rc != 0 or vals[0].nvmlReturn != 0 or vals[1].nvmlReturn != 0:
            raise EnvError(f"NVML PCIe byte counters not supported on this GPU/driver "
                           f"(nvmlDeviceGetFieldValues {rc}/{vals[0].nvmlReturn}/{vals[1].nvmlReturn})")
        tx, bits = decode_field_value(vals[0].valueType, vals[0].value)
        rx, _ = decode_field_value(vals[1].valueType, vals[1].value)
        return int(tx), int(rx), bits

    def link(self, h):
        vals = []
        for fn in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                   "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"):
            v = ctypes.c_uint()
            vals.append(v.value if getattr(self.lib, fn)(h, ctypes.byref(v)) == 0 else None)
        if vals[0] is None or vals[1] is None:
            return None
        return {"gen": vals[0], "width": vals[1], "max_gen": vals[2], "max_width": vals[3], "source": "NVML"}


def read_link(bdf, nvml, nvml_handle, sysfs="/sys"):
    """The link's current generation and width: sysfs, then NVML, then nvidia-smi."""
    if bdf:
        d = os.path.join(sysfs, "bus/pci/devices", bdf)
        try:
            vals = []
            for name in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
                with open(os.path.join(d, name)) as f:
                    vals.append(f.read())
            link = parse_sysfs_link(*vals)
            if link:
                link["source"] = f"sysfs {bdf}"
                return link
        except OSError:
            pass
    if nvml is not None and nvml_handle is not None:
        link = nvml.link(nvml_handle)
        if link:
            return link
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={NVIDIA_SMI_LINK_QUERY}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        link = parse_nvidia_smi_link(line)
        if link and (not bdf or link["bdf"] == bdf):
            link["source"] = "nvidia-smi"
            return link
    return None


def device_bdf(torch, index):
    props = torch.cuda.get_device_properties(index)
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return None


def run_gpu(args, deadline):
    """Runs the copies under the agent; returns (cases, records, link, counter reason, agent info, notes)."""
    torch = import_torch()
    if not torch.cuda.is_available():
        raise EnvError("torch.cuda.is_available() is False: no NVIDIA GPU or CUDA driver visible to PyTorch")
    if args.device_index >= torch.cuda.device_count():
        raise EnvError(f"--device {args.device}: only {torch.cuda.device_count()} CUDA device(s)")
    idx = args.device_index
    torch.cuda.set_device(idx)
    torch.zeros(1, device=f"cuda:{idx}")  # create the context: libcuda is mapped before the agent scans us
    torch.cuda.synchronize()
    bdf = device_bdf(torch, idx)
    name = torch.cuda.get_device_name(idx)
    log(f"device cuda:{idx} {name} {bdf or '(PCI address unknown)'}")
    notes = []

    nvml = handle = None
    counter_reason = None
    try:
        nvml = Nvml()
        if bdf:
            handle = nvml.handle(bdf)
            nvml.pcie_bytes(handle)
        else:
            counter_reason = "counters unavailable: the GPU's PCI address is unknown (old torch)"
    except EnvError as e:
        counter_reason = f"counters unavailable: {e}"
        handle = None
    use_counters = handle is not None and counter_reason is None

    own = args.records is not None
    out_path = args.records or tempfile.mkstemp(prefix="gpucheck-", suffix=".jsonl")[1]
    agent = Agent(args.agent, out_path, os.getpid(), args.agent_arg)
    stopped = False
    try:
        agent.wait_ready(min(60, deadline - time.monotonic() - STOP_RESERVE_S))
        libs = agent.attached()
        log(f"agent running, {len(libs)} librar{'y' if len(libs) == 1 else 'ies'} probed")
        if not any("libcudart" in l or "libcuda." in l for l in libs):
            notes.append("the agent's log names no libcudart/libcuda attach: " + ", ".join(libs or ["none"]))

        # Allocated only now: the agent sees the pinned allocation and knows the pageable one is new.
        top = max(args.size_list)
        pinned = torch.empty(top, dtype=torch.uint8, pin_memory=True)
        pageable = torch.empty(top, dtype=torch.uint8)
        pinned.fill_(7)
        pageable.fill_(7)
        dev = torch.empty(top, dtype=torch.uint8, device=f"cuda:{idx}")
        host = {"pinned": pinned, "pageable": pageable}
        copy_deadline = deadline - STOP_RESERVE_S

        # The link trains down when idle: read it while pinned copies keep it busy.
        box = {}
        reader = threading.Thread(target=lambda: box.setdefault("link", read_link(bdf, nvml, handle)), daemon=True)
        reader.start()
        busy_until = time.monotonic() + 25
        while reader.is_alive() and time.monotonic() < min(busy_until, copy_deadline):
            for _ in range(4):
                dev.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
        reader.join(max(0.0, min(busy_until, copy_deadline) - time.monotonic()))
        link = box.get("link")
        log("link: " + describe_link(link))

        cases = plan_cases(args.size_list, args.repeats)
        for c in cases:
            h = host[c.kind][:c.size]
            d = dev[:c.size]
            copy = (lambda: d.copy_(h, non_blocking=True)) if c.direction == "H2D" else \
                (lambda: h.copy_(d, non_blocking=True))
            copy()  # warm-up, outside the window
            torch.cuda.synchronize()
            before = nvml.pcie_bytes(handle) if use_counters else None
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            c.start_ns = time.monotonic_ns()
            ev0.record()
            for _ in range(c.count):
                if time.monotonic() > copy_deadline:
                    raise EnvError(f"time budget of {args.timeout:g} s exceeded during {c.name} "
                                   f"{format_size(c.size)}: use smaller --sizes or fewer --repeats")
                copy()
            ev1.record()
            torch.cuda.synchronize()
            c.end_ns = time.monotonic_ns()
            c.seconds = ev0.elapsed_time(ev1) / 1000
            if use_counters:
                after = nvml.pcie_bytes(handle)
                i = 1 if c.direction == "H2D" else 0  # (tx, rx): RX is host->device from the GPU's view
                c.counter_bytes = counter_delta(before[i], after[i], before[2])
            log(f"{c.name:13} {format_size(c.size):>8} × {c.count}: {c.gbps or 0:.2f} GB/s")
        time.sleep(1.2)  # the agent flushes its output every second
        agent.stop(max(5, deadline - time.monotonic() - 5))
        stopped = True
        summary = agent.summary()
        with open(out_path) as f:
            records = load_records(f)
    finally:
        if not stopped:
            try:
                agent.stop(10)
            except EnvError:
                pass
        if not own:
            try:
                os.unlink(out_path)
            except OSError:
                pass
    if summary.get("drops"):
        notes.append(f"the agent dropped {summary['drops']} events (ring_full={summary.get('ring_full', 0)})")
    info = {"summary": summary, "records": len(records), "attached": agent.attached(), "pid": os.getpid()}
    return cases, records, link, counter_reason, info, notes


def start_watchdog(deadline, on_expiry):
    """Hard stop at the deadline even if a CUDA call hangs."""
    t = threading.Timer(max(0.0, deadline - time.monotonic()), on_expiry)
    t.daemon = True
    t.start()
    return t


def main(argv=None, runner=run_gpu, out=None):
    out = out or sys.stdout
    started = time.monotonic()
    try:
        args = parse_args(argv)
    except UsageError as e:
        print(f"gpucheck: {e}", file=sys.stderr)
        return EXIT_USAGE
    deadline = started + args.timeout

    def expire():
        log(f"time budget of {args.timeout:g} s exceeded: stopping the agent and exiting")
        for a in RUNNING_AGENTS:
            try:
                a.stop(5)
            except (EnvError, OSError):
                pass
        os._exit(EXIT_ENV)

    watchdog = start_watchdog(deadline, expire) if runner is run_gpu else None
    try:
        cases, records, link, counter_reason, agent, notes = runner(args, deadline)
    except EnvError as e:
        print(f"gpucheck: {e}", file=sys.stderr)
        return EXIT_ENV
    except KeyboardInterrupt:
        print("gpucheck: interrupted", file=sys.stderr)
        return EXIT_ENV
    finally:
        if watchdog:
            watchdog.cancel()
    pid = agent.get("pid")
    results = match_records(cases, records, pid=pid)
    outside = unmatched_copies(results, records, pid=pid)
    if outside:
        notes = list(notes) + [f"{outside} H2D/D2H records outside the timed windows "
                               "(warm-ups and the link reading; not checked)"]
    counters = check_counters(cases) if counter_reason is None else []
    report = build_report(results, link=link, counters=counters, counter_reason=counter_reason,
                          agent=agent, notes=notes)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True), file=out)
    else:
        print(format_report(report), file=out)
    out.flush()
    return exit_code(report)


if __name__ == "__main__":
    sys.exit(main())
