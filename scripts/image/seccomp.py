#!/usr/bin/env python3
"""Derive the agent's seccomp profile from podman's default one.

podman's default profile (containers/common 0.50, Debian 12) allows bpf(2)
and perf_event_open(2) only to a container holding CAP_SYS_ADMIN, so the agent
with CAP_BPF and CAP_PERFMON fails at its first map ("map create: operation
not permitted"), and denies move_pages(2) to all, with which the agent
asks (never moves) the NUMA node of a copy's host pages. This profile is the
default one with bpf allowed to CAP_BPF holders and perf_event_open to
CAP_PERFMON holders as well, as in Linux's own split of those capabilities
out of CAP_SYS_ADMIN (5.8), and move_pages to CAP_SYS_PTRACE holders (the
kernel asks for ptrace access to the process whose pages are asked).

With a third argument it also writes the profile Kubernetes loads as a
Localhost one (/var/lib/kubelet/seccomp/lanewatch.json): the runtime spec's
form (containerd reads it as such: defaultAction, architectures, syscalls
with names, action, args, errnoRet), which has no conditions on
capabilities, so each rule is resolved here for the container's bounding
set, the agent's five capabilities (deploy/helm/lanewatch), on x86_64.
Usage: seccomp.py DEFAULT.json OUT.json [LOCALHOST.json]
"""
import json
import sys

GRANT = {"bpf": ["CAP_BPF", "CAP_SYS_ADMIN"], "perf_event_open": ["CAP_PERFMON", "CAP_SYS_ADMIN"], "move_pages": ["CAP_SYS_PTRACE"]}


def derive(profile):
    # Every rule naming them goes (a deny is the default action anyway);
    # one allow per capability is added instead.
    for rule in profile["syscalls"]:
        rule["names"] = [n for n in rule["names"] if n not in GRANT]
    profile["syscalls"] = [r for r in profile["syscalls"] if r["names"]]
    for name, caps in GRANT.items():
        for c in caps:
            profile["syscalls"].append({"names": [name], "action": "SCMP_ACT_ALLOW", "includes": {"caps": [c]}, "excludes": {}})
    return profile


# The container's capabilities (the chart's capabilities.add) and arch:
# rules name it as Go does, the profile's architectures as libseccomp does.
CAPS = {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_CHECKPOINT_RESTORE"}
ARCH, SCMP_ARCH = "amd64", "SCMP_ARCH_X86_64"


def applies(rule, caps, arch):
    """Whether a rule of the containers/common form holds for a container
    with bounding set caps on arch: every included capability held, none
    excluded; its arch included (when named), not excluded."""
    inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
    if set(inc) - {"caps", "arches"} or set(exc) - {"caps", "arches"}:
        raise ValueError("rule %s: conditions %s %s not resolved" % (rule["names"], inc, exc))
    return (set(inc.get("caps", [])) <= caps and not set(exc.get("caps", [])) & caps
            and (not inc.get("arches") or arch in inc["arches"]) and arch not in exc.get("arches", []))


def resolve(profile, caps=CAPS, arch=ARCH, scmp_arch=SCMP_ARCH):
    """The profile as the runtime spec's LinuxSeccomp for that container."""
    arches = [a for a in profile["archMap"] if a["architecture"] == scmp_arch]
    out = {"defaultAction": profile["defaultAction"],
           "architectures": [scmp_arch] + (arches[0]["subArchitectures"] if arches else []),
           "syscalls": []}
    if "defaultErrnoRet" in profile:
        out["defaultErrnoRet"] = profile["defaultErrnoRet"]
    for rule in profile["syscalls"]:
        if not applies(rule, caps, arch):
            continue
        r = {"names": rule["names"], "action": rule["action"]}
        for k in ("args", "errnoRet"):
            if rule.get(k):
                r[k] = rule[k]
        out["syscalls"].append(r)
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        out = derive(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump(resolve(out), f, indent=1)
