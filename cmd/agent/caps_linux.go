package main

// The image's binary carries its capabilities as file capabilities in the
// permitted set only (scripts/image/build.sh: setcap …=p). Kubernetes gives
// a non-root container process no ambient capabilities, so these are what
// it gets; without the effective bit an exec never fails when the runtime's
// bounding set lacks one (the kernel refuses an effective-bit binary it
// cannot give all of them), and the agent names what is missing instead.
//
// The agent raises its permitted capabilities into its effective set here,
// in a C constructor: capabilities belong to each thread, and the Go
// runtime has several before main (4 at a Go program's first init on this
// project's VM; syscall.AllThreadsSyscall is refused with cgo). The constructor runs on the only thread, before the runtime
// starts; every thread it makes later inherits the set. Nothing is gained
// that the process was not already permitted; on failure the set stays as
// it was and probes.MissingPrivileges names what is missing.

/*
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

static void __attribute__((constructor)) lanewatch_raise_permitted(void) {
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
	if (syscall(SYS_capget, &hdr, data) != 0)
		return;
	for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++)
		data[i].effective = data[i].permitted;
	syscall(SYS_capset, &hdr, data);
}
*/
import "C"
