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
Usage: seccomp.py DEFAULT.json OUT.json
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


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        out = derive(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)
