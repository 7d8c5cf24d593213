/* The few kernel types the programs touch, instead of a generated vmlinux.h.
 * pt_regs is the x86-64 register frame handed to uprobes; task_struct is read
 * with CO-RE so field offsets come from the running kernel's BTF. */
#ifndef LW_X86_TYPES_H
#define LW_X86_TYPES_H

struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

#endif
