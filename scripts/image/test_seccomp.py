"""Table tests of seccomp.py: deriving the agent's profile and resolving it
for Kubernetes (the runtime spec's form, no conditions)."""
import unittest

import seccomp

FIVE = seccomp.CAPS


def rule(names, action="SCMP_ACT_ALLOW", **kw):
    return dict({"names": names, "action": action, "args": [], "includes": {}, "excludes": {}}, **kw)


class Applies(unittest.TestCase):
    def test_table(self):
        for name, r, want in [
            ("no condition", rule(["read"]), True),
            ("a held capability", rule(["open_by_handle_at"], includes={"caps": ["CAP_DAC_READ_SEARCH"]}), True),
            ("one not held", rule(["mount"], includes={"caps": ["CAP_SYS_ADMIN"]}), False),
            ("held and not held", rule(["x"], includes={"caps": ["CAP_BPF", "CAP_SYS_ADMIN"]}), False),
            ("excluded, not held", rule(["setns"], "SCMP_ACT_ERRNO", excludes={"caps": ["CAP_SYS_ADMIN"]}), True),
            ("excluded, held", rule(["x"], excludes={"caps": ["CAP_BPF"]}), False),
            ("this arch", rule(["arch_prctl"], includes={"arches": ["amd64", "x32"]}), True),
            ("another arch", rule(["set_tls"], includes={"arches": ["arm", "arm64"]}), False),
            ("this arch excluded", rule(["x"], excludes={"arches": ["amd64"]}), False),
        ]:
            with self.subTest(name):
                self.assertEqual(seccomp.applies(r, FIVE, "amd64"), want)

    def test_unknown_condition_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "minKernel"):
            seccomp.applies(rule(["x"], includes={"minKernel": "4.8"}), FIVE, "amd64")


class Resolve(unittest.TestCase):
    def profile(self):
        return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
                "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
                            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]}],
                "syscalls": [rule(["read", "move_pages"]),
                             rule(["bpf", "perf_event_open", "mount"], includes={"caps": ["CAP_SYS_ADMIN"]}),
                             rule(["setns"], "SCMP_ACT_ERRNO", errnoRet=1, excludes={"caps": ["CAP_SYS_ADMIN"]}),
                             rule(["personality"], args=[{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}])]}

    def test_derived_then_resolved(self):
        out = seccomp.resolve(seccomp.derive(self.profile()))
        self.assertEqual(out["architectures"], ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"])
        self.assertEqual(out["defaultErrnoRet"], 38)
        allowed = {n for r in out["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and "args" not in r for n in r["names"]}
        self.assertTrue({"read", "bpf", "perf_event_open", "move_pages"} <= allowed, allowed)
        self.assertNotIn("mount", allowed)  # CAP_SYS_ADMIN's, not the agent's
        self.assertIn({"names": ["setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}, out["syscalls"])
        self.assertIn({"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]}, out["syscalls"])
        for r in out["syscalls"]:
            self.assertLessEqual(set(r), {"names", "action", "args", "errnoRet"}, r)


if __name__ == "__main__":
    unittest.main()
