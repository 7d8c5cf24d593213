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

/* System V AMD64: rdi, rsi, rdx, rcx, r8, r9 carry the first six
 * arguments, the rest are on the stack above the return address, rax the
 * result. */
#define LW_REG_ARGS 6
#define LW_CAPTURE_REGS(e, ctx)                                                  \
	do {                                                                     \
		(e)->args[0] = (ctx)->di;                                        \
		(e)->args[1] = (ctx)->si;                                        \
		(e)->args[2] = (ctx)->dx;                                        \
		(e)->args[3] = (ctx)->cx;                                        \
		(e)->args[4] = (ctx)->r8;                                        \
		(e)->args[5] = (ctx)->r9;                                        \
		(e)->args[6] = 0;                                                \
		(e)->args[7] = 0;                                                \
		(e)->args[8] = 0;                                                \
	} while (0)
#define LW_ARG0(ctx) ((ctx)->di)
#define LW_ARG1(ctx) ((ctx)->si)
#define LW_RC(ctx) ((ctx)->ax)
#define LW_IP(ctx) ((ctx)->ip)
#define LW_SP(ctx) ((ctx)->sp)
#define LW_STACK_ARGS(sp) ((sp) + 8)

#endif
