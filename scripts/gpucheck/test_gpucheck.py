"""Tests of gpucheck's non-GPU parts (standard library only).

testdata/agent_records.jsonl is real `agent run` output for the reference data
path (make refpath), recorded with

    sudo ./bin/agent run --output x.jsonl --web.listen-address "" --otlp.grpc-listen "" \
      --otlp.http-listen "" --spans off \
      --lib refpath/build/plain/libcudart.so.12 --lib refpath/build/lib/libcuda.so.1
    refpath/build/bin/kvpath --scenario pageable-load|hicache-load|writeback-duplex --truth t.jsonl

keeping the first six copies of each scenario and direction plus the record after
them; testdata/windows.json holds, per kept group, the scenario's ground-truth time
window (first t_call_ns .. sixth t_return_ns) and what the copies were. The 1 MiB
pageable (pageable-load) and 1 MiB pinned (hicache-load) H2D copies differ only in
their windows, as a torch run's pinned and pageable cases do.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpucheck as g  # noqa: E402

SCRIPT = os.path.join(HERE, "gpucheck.py")
DATA = os.path.join(HERE, "testdata")
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
MiB = 1 << 20


def fixture_records():
    with open(os.path.join(DATA, "agent_records.jsonl")) as f:
        return g.load_records(f)


def fixture_cases(**override):
    with open(os.path.join(DATA, "windows.json")) as f:
        ws = json.load(f)
    cases = []
    for w in ws:
        c = g.Case(w["direction"], w["host_mem"], w["bytes"], w["count"], w["start_ns"], w["end_ns"])
        for k, v in override.get(w["scenario"] + " " + w["direction"], {}).items():
            setattr(c, k, v)
        cases.append(c)
    return cases


def run_script(*args, env_extra=None, fake_torch=None, timeout=60):
    """Runs gpucheck.py in a child. fake_torch: source of a torch.py shadowing any real one."""
    env = dict(os.environ)
    env.update(env_extra or {})
    with tempfile.TemporaryDirectory() as d:
        if fake_torch is not None:
            with open(os.path.join(d, "torch.py"), "w") as f:
                f.write(fake_torch)
            env["PYTHONPATH"] = d
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=d)


NO_TORCH = "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
NO_CUDA = "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n"


class TestSizes(unittest.TestCase):
    def test_units(self):
        for text, want in [("4M", 4 * MiB), ("1G", 1 << 30), ("512K", 512 << 10), ("4096", 4096),
                           ("4MiB", 4 * MiB), ("4mb", 4 * MiB), (" 64M ", 64 * MiB), ("16G", 16 << 30)]:
            with self.subTest(text=text):
                self.assertEqual(g.parse_size(text), want)

    def test_bad(self):
        for text in ["", "M", "4X", "-1M", "0", "0M", "1.5M", "4 M B", "17G", "0x10", "4T"]:
            with self.subTest(text=text), self.assertRaises(g.UsageError) as cm:
                g.parse_size(text)
            self.assertIn(repr(text), str(cm.exception))

    def test_list(self):
        self.assertEqual(g.parse_sizes("256M,4M,64M"), [4 * MiB, 64 * MiB, 256 * MiB])
        with self.assertRaisesRegex(g.UsageError, "4 MiB given twice"):
            g.parse_sizes("4M,4096K")
        with self.assertRaisesRegex(g.UsageError, "bad size ''"):
            g.parse_sizes("4M,,64M")

    def test_format(self):
        self.assertEqual(g.format_size(4 * MiB), "4 MiB")
        self.assertEqual(g.format_size(1 << 30), "1 GiB")
        self.assertEqual(g.format_size(1536 << 10), "1536 KiB")
        self.assertEqual(g.format_size(1000), "1000 B")

    def test_device(self):
        self.assertEqual(g.parse_device("cuda:1"), 1)
        self.assertEqual(g.parse_device("0"), 0)
        for bad in ["gpu0", "cuda:", "cuda:-1", ""]:
            with self.subTest(bad=bad), self.assertRaises(g.UsageError):
                g.parse_device(bad)


class TestLink(unittest.TestCase):
    def test_capacity(self):
        for gen, width, gbps in [(5, 16, 63.02), (4, 16, 31.51), (3, 16, 15.75), (6, 16, 121.00),
                                 (5, 8, 31.51), (4, 4, 7.88), (2, 16, 8.00), (1, 1, 0.25), (6, 8, 60.50)]:
            with self.subTest(gen=gen, width=width):
                self.assertAlmostEqual(g.link_capacity(gen, width) / 1e9, gbps, places=2)

    def test_capacity_unknown(self):
        for gen, width in [(0, 16), (7, 16), (5, 0), (5, 3), (None, 16)]:
            with self.subTest(gen=gen, width=width), self.assertRaises(ValueError):
                g.link_capacity(gen, width)

    def test_sysfs(self):
        self.assertEqual(g.parse_sysfs_link("32.0 GT/s PCIe\n", "16\n", "32.0 GT/s PCIe\n", "16\n"),
                         {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16})
        self.assertEqual(g.parse_sysfs_link("2.5 GT/s PCIe", "16", "16.0 GT/s PCIe", "16")["gen"], 1)
        self.assertEqual(g.parse_sysfs_link("8.0 GT/s", "8")["gen"], 3)
        self.assertEqual(g.parse_sysfs_link("64.0 GT/s PCIe", "16")["gen"], 6)
        self.assertIsNone(g.parse_sysfs_link("Unknown", "16"))
        self.assertIsNone(g.parse_sysfs_link("32.0 GT/s PCIe", ""))

    def test_nvidia_smi(self):
        self.assertEqual(g.parse_nvidia_smi_link("00000000:17:00.0, 5, 16, 5, 16"),
                         {"bdf": "0000:17:00.0", "gen": 5, "width": 16, "max_gen": 5, "max_width": 16})
        self.assertIsNone(g.parse_nvidia_smi_link("00000000:17:00.0, [N/A], [N/A], 5, 16"))
        self.assertIsNone(g.parse_nvidia_smi_link("garbage"))

    def test_bdf(self):
        self.assertEqual(g.normalize_bdf("00000000:17:00.0"), "0000:17:00.0")
        self.assertEqual(g.normalize_bdf("0000:AB:00.0"), "0000:ab:00.0")
        self.assertEqual(g.normalize_bdf("17:00.0"), "0000:17:00.0")
        self.assertIsNone(g.normalize_bdf("GPU-1234"))

    def test_describe(self):
        s = g.describe_link({"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "source": "sysfs"})
        self.assertEqual(s, "PCIe Gen5 x16 = 63.02 GB/s per direction (sysfs)")
        s = g.describe_link({"gen": 4, "width": 8, "max_gen": 5, "max_width": 16, "source": "NVML"})
        self.assertIn("trained below its maximum Gen5 x16", s)
        self.assertIn("unknown", g.describe_link(None))


class TestMatching(unittest.TestCase):
    def test_fixture_all_traced(self):
        results = g.match_records(fixture_cases(), fixture_records())
        self.assertEqual([(r.case.name, r.case.size, r.traced) for r in results],
                         [("H2D pageable", MiB, 6), ("H2D pinned", MiB, 6),
                          ("H2D pinned", 2 * MiB, 6), ("D2H pinned", 2 * MiB, 6)])
        for r in results:
            with self.subTest(case=r.case.name):
                self.assertTrue(r.count_ok)
                self.assertTrue(r.kind_ok, r.kinds)
                self.assertEqual(r.traced_bytes, r.case.expected_bytes)
                self.assertEqual(r.other_in_window, 0)
        # the record after each window is not a copy of any case
        self.assertEqual(g.unmatched_copies(results, fixture_records()), 4)

    def test_wrong_kind(self):
        # the pageable-load window, expected pinned: traced, but the kind check fails
        cases = fixture_cases(**{"pageable-load H2D": {"kind": "pinned"}})
        r = g.match_records(cases, fixture_records())[0]
        self.assertTrue(r.count_ok)
        self.assertFalse(r.kind_ok)
        self.assertEqual(r.kinds, {"pageable": 6})

    def test_missing_copies(self):
        cases = fixture_cases(**{"hicache-load H2D": {"count": 8}})
        r = g.match_records(cases, fixture_records())[1]
        self.assertEqual(r.traced, 6)
        self.assertFalse(r.count_ok)

    def test_pid_filter(self):
        recs = fixture_records()
        pid = recs[0]["pid"]
        results = g.match_records(fixture_cases(), recs, pid=pid)
        self.assertEqual(sum(r.traced for r in results), 6)
        self.assertEqual(sum(r.traced for r in g.match_records(fixture_cases(), recs, pid=1)), 0)

    def test_other_sizes_in_window(self):
        c = g.Case("H2D", "pinned", 4 * MiB, 1, 100, 200)
        recs = [{"pid": 1, "direction": "H2D", "bytes": 4 * MiB, "host_mem": "pinned", "submit_ns": 150},
                {"pid": 1, "direction": "H2D", "bytes": 4096, "host_mem": "pinned", "submit_ns": 160},
                {"pid": 1, "direction": "D2H", "bytes": 4 * MiB, "host_mem": "pinned", "submit_ns": 170},
                {"pid": 1, "direction": "H2D", "bytes": 4 * MiB, "host_mem": "pinned", "submit_ns": 201}]
        r = g.match_records([c], recs)[0]
        self.assertEqual((r.traced, r.other_in_window), (1, 1))
        self.assertTrue(r.count_ok and r.kind_ok)

    def test_host_mem_fallback(self):
        self.assertEqual(g.record_host_mem({"direction": "D2H", "dst": {"memory": "pinned"}}), "pinned")
        self.assertEqual(g.record_host_mem({"direction": "H2D", "src": {"memory": "unknown"}}), "unknown")
        self.assertEqual(g.record_host_mem({"direction": "D2D"}), "none")

    def test_load_records_errors(self):
        with self.assertRaisesRegex(ValueError, "line 2 is not JSON"):
            g.load_records(['{"pid":1}', "{not json", ""])
        self.assertEqual(len(g.load_records(['{"pid":1}', "", "  "])), 1)


class TestCounters(unittest.TestCase):
    def cases(self, h2d_counted, d2h_counted):
        return [g.Case("H2D", "pinned", 100, 10, counter_bytes=h2d_counted),
                g.Case("D2H", "pageable", 100, 10, counter_bytes=d2h_counted)]

    def test_within_10_percent(self):
        cc = g.check_counters(self.cases(1090, 910))
        self.assertEqual([(c["direction"], c["ok"]) for c in cc], [("H2D", True), ("D2H", True)])

    def test_outside_10_percent(self):
        cc = g.check_counters(self.cases(1110, 890))
        self.assertEqual([c["ok"] for c in cc], [False, False])
        self.assertAlmostEqual(cc[0]["ratio"], 1.11)

    def test_unavailable(self):
        cc = g.check_counters(self.cases(None, 1000))
        self.assertIsNone(cc[0]["ok"])
        self.assertTrue(cc[1]["ok"])

    def test_delta_wraps(self):
        self.assertEqual(g.counter_delta(10, 25), 15)
        self.assertEqual(g.counter_delta((1 << 32) - 10, 5, bits=32), 15)
        self.assertEqual(g.counter_delta((1 << 64) - 1, 0), 1)
        self.assertIsNone(g.counter_delta(None, 5))

    def test_decode_field_value(self):
        import struct
        self.assertEqual(g.decode_field_value(3, struct.pack("<Q", 1 << 40)), (1 << 40, 64))
        self.assertEqual(g.decode_field_value(1, struct.pack("<I", 7) + b"\xff" * 4), (7, 32))
        self.assertEqual(g.decode_field_value(99, b"\0" * 8), (None, 64))


def sample_report(kind_override=None, counters=True):
    over = {"pageable-load H2D": {"kind": kind_override}} if kind_override else {}
    cases = fixture_cases(**over)
    for c in cases:
        c.seconds = c.expected_bytes / 40e9  # 40 GB/s
        c.counter_bytes = int(c.expected_bytes * 1.03) if counters else None
    results = g.match_records(cases, fixture_records())
    link = {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "source": "sysfs 0000:17:00.0"}
    return g.build_report(results, link=link, counters=g.check_counters(cases) if counters else [],
                          counter_reason=None if counters else "counters unavailable: test")


class TestReport(unittest.TestCase):
    def test_pass_table_last(self):
        rep = sample_report()
        self.assertTrue(rep["ok"], rep["failures"])
        self.assertEqual(g.exit_code(rep), g.EXIT_OK)
        text = g.format_report(rep)
        lines = text.splitlines()
        table = lines[lines.index("") + 1:]
        self.assertEqual(table[0].split(), ["case", "size", "traced", "kind", "ok", "GB/s", "%", "link"])
        self.assertEqual(len(table), 1 + 4 + 1)
        self.assertTrue(table[-1].startswith("PASS"))
        # fixed columns: every row's GB/s ends where the header's does
        end = table[0].index("GB/s") + len("GB/s")
        for row in table[1:5]:
            self.assertEqual(row[end - 5:end], "40.00", row)
            self.assertTrue(row.endswith("63.5%"), row)
        self.assertIn("H2D pageable   1 MiB            6/6  yes", table[1])
        self.assertIn("link: PCIe Gen5 x16 = 63.02 GB/s per direction (sysfs 0000:17:00.0)", text)
        self.assertIn("counters H2D:", text)

    def test_fail_kind(self):
        rep = sample_report(kind_override="pinned")
        self.assertFalse(rep["ok"])
        self.assertEqual(g.exit_code(rep), g.EXIT_FAIL)
        self.assertEqual(rep["failures"], ["H2D pinned 1 MiB: host_mem should be pinned, got pageable×6"])
        lines = g.format_report(rep).splitlines()
        self.assertTrue(lines[0].startswith("FAIL  H2D pinned 1 MiB"))
        self.assertIn(" no ", lines[-5])
        self.assertEqual(lines[-1], "FAIL: 1 check(s) failed (listed above)")

    def test_counters_unavailable_is_not_a_failure(self):
        rep = sample_report(counters=False)
        self.assertTrue(rep["ok"])
        self.assertIn("counters: counters unavailable: test", g.format_report(rep))
        self.assertFalse(rep["counters"]["available"])

    def test_counter_failure(self):
        cases = fixture_cases()
        for c in cases:
            c.counter_bytes = int(c.expected_bytes * 1.2)
        rep = g.build_report(g.match_records(cases, fixture_records()), counters=g.check_counters(cases))
        self.assertFalse(rep["ok"])
        self.assertEqual(len(rep["failures"]), 2)
        self.assertIn("+20.0% off", rep["failures"][0])
        self.assertIn("link capacity unknown", g.format_report(rep))
        self.assertIn("   -", g.format_report(rep).splitlines()[-2])

    def test_json_round_trip(self):
        rep = sample_report()
        back = json.loads(json.dumps(rep))
        self.assertEqual(back["link"]["capacity_gbps"], 63.02)
        self.assertEqual(back["cases"][0]["traced"], 6)


def fake_runner(kind_override=None):
    def run(args, deadline):
        cases = fixture_cases(**({"pageable-load H2D": {"kind": kind_override}} if kind_override else {}))
        for c in cases:
            c.seconds = 0.001
        return cases, fixture_records(), None, "counters unavailable: test", {}, []
    return run


class TestMain(unittest.TestCase):
    def test_exit_codes(self):
        out = io.StringIO()
        self.assertEqual(g.main([], runner=fake_runner(), out=out), g.EXIT_OK)
        self.assertTrue(out.getvalue().rstrip().splitlines()[-1].startswith("PASS"))
        out = io.StringIO()
        self.assertEqual(g.main([], runner=fake_runner("pinned"), out=out), g.EXIT_FAIL)
        self.assertTrue(out.getvalue().rstrip().splitlines()[-1].startswith("FAIL"))

    def test_json(self):
        out = io.StringIO()
        self.assertEqual(g.main(["--json"], runner=fake_runner("pinned"), out=out), g.EXIT_FAIL)
        rep = json.loads(out.getvalue())
        self.assertFalse(rep["ok"])
        self.assertEqual(len(rep["cases"]), 4)

    def test_env_error(self):
        def broken(args, deadline):
            raise g.EnvError("no GPU here")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(g.main([], runner=broken, out=io.StringIO()), g.EXIT_ENV)
        self.assertEqual(err.getvalue(), "gpucheck: no GPU here\n")

    def test_usage_errors(self):
        for argv, text in [(["--sizes", "4X"], "bad size '4X'"), (["--timeout", "600"], "under five minutes"),
                           (["--repeats", "0"], "--repeats 0"), (["--device", "gpu"], "bad device"),
                           (["--sizes", "16G", "--repeats", "100"], "more than --timeout")]:
            with self.subTest(argv=argv), self.assertRaisesRegex(g.UsageError, text):
                g.parse_args(argv)

    def test_defaults(self):
        a = g.parse_args([])
        self.assertEqual((a.agent, a.size_list, a.repeats, a.device_index, a.timeout, a.json),
                         ("./bin/agent", [4 * MiB, 64 * MiB, 256 * MiB], 5, 0, 240, False))
        self.assertEqual(len(g.plan_cases(a.size_list, a.repeats)), 12)


class TestScript(unittest.TestCase):
    """The script as a user runs it: no traceback, one clear line."""

    def test_help_without_torch(self):
        p = run_script("--help", fake_torch=NO_TORCH)
        self.assertEqual(p.returncode, 0, p.stderr)
        for word in ("--agent", "--sizes", "--repeats", "--device", "--timeout", "--json", "exit status"):
            self.assertIn(word, p.stdout)

    def test_without_torch(self):
        p = run_script(fake_torch=NO_TORCH)
        self.assertEqual(p.returncode, g.EXIT_ENV)
        self.assertEqual(p.stdout, "")
        self.assertNotIn("Traceback", p.stderr)
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertRegex(lines[0], r"^gpucheck: PyTorch is not importable .*No module named 'torch'")

    def test_without_cuda(self):
        p = run_script(fake_torch=NO_CUDA)
        self.assertEqual(p.returncode, g.EXIT_ENV)
        self.assertNotIn("Traceback", p.stderr)
        self.assertIn("torch.cuda.is_available() is False", p.stderr)

    def test_bad_size(self):
        p = run_script("--sizes", "4M,oops", fake_torch=NO_TORCH)
        self.assertEqual(p.returncode, g.EXIT_USAGE)
        self.assertEqual(p.stderr.strip().splitlines(), [
            "gpucheck: bad size 'oops': want a positive integer with an optional K, M or G suffix "
            "(binary: 4M = 4 MiB), e.g. 4M,64M,256M"])


REFPATH = os.path.join(REPO, "refpath", "build")
AGENT = os.path.join(REPO, "bin", "agent")


@unittest.skipUnless(os.geteuid() == 0 and os.path.exists(AGENT)
                     and os.path.exists(os.path.join(REFPATH, "plain", "libcudart.so.12")),
                     "needs root, bin/agent and the reference data path (make build)")
class TestUnderAgent(unittest.TestCase):
    """The whole check under the real agent, torch replaced by testdata/fake_torch
    over the reference data path's libcudart: agent start, ready wait, --pid,
    windows, SIGINT, records and kinds, as on a GPU host."""

    def test_reference_data_path(self):
        cudart = os.path.join(REFPATH, "plain", "libcudart.so.12")
        env = dict(os.environ, GPUCHECK_FAKE_CUDART=cudart, PYTHONPATH=os.path.join(DATA, "fake_torch"))
        p = subprocess.run([sys.executable, SCRIPT, "--agent", AGENT, "--sizes", "1M,4M", "--repeats", "3",
                            "--timeout", "60", "--json", f"--agent-arg=--lib={cudart}",
                            f"--agent-arg=--lib={os.path.join(REFPATH, 'lib', 'libcuda.so.1')}"],
                           capture_output=True, text=True, env=env, timeout=90, cwd=REPO)
        self.assertEqual(p.returncode, g.EXIT_OK, p.stdout + p.stderr)
        rep = json.loads(p.stdout)
        self.assertEqual([(c["case"], c["size"], c["traced"], c["kind_ok"]) for c in rep["cases"]],
                         [(n, s, 3, True) for n in ("H2D pinned", "H2D pageable", "D2H pinned", "D2H pageable")
                          for s in (MiB, 4 * MiB)])
        self.assertFalse(rep["counters"]["available"])


if __name__ == "__main__":
    unittest.main()
