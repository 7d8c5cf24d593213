/* SPDX-License-Identifier: GPL-2.0 */
/* The agent's PID namespace, shared by every program (docs/design.md,
 * "Late attach"). In a PID namespace other than the host's (a sidecar
 * sharing its pod's), the agent knows processes by their pids there:
 * pidns_dev and pidns_ino name that namespace (set at load), and threads
 * whose own namespace is another (the host's, other pods') are ignored by
 * every program. 0: the host's, where every thread is known by its host pid. */
#ifndef LW_PIDNS_H
#define LW_PIDNS_H

volatile const __u64 pidns_dev = 0;
volatile const __u64 pidns_ino = 0;

/* current_id is bpf_get_current_pid_tgid() as the agent's namespace sees
 * it; 0 for a thread outside it. */
static __always_inline __u64 current_id(void)
{
	if (!pidns_ino)
		return bpf_get_current_pid_tgid();
	struct bpf_pidns_info ns = {};
	if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
		return 0;
	return (__u64)ns.tgid << 32 | ns.pid;
}

/* foreign: the current thread is outside the agent's PID namespace. */
static __always_inline int foreign(void)
{
	return pidns_ino && !current_id();
}

#endif
