/* The few kernel types the programs touch on arm64, instead of a generated
 * vmlinux.h: pt_regs begins with the user registers (x0-x30, sp, pc,
 * pstate) handed to uprobes; task_struct is read with CO-RE. */
#ifndef LW_ARM64_TYPES_H
#define LW_ARM64_TYPES_H

struct pt_regs {
	unsigned long regs[31];
	unsigned long sp, pc, pstate;
};

struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

/* AAPCS64: x0-x7 carry the first eight arguments, the ninth is at the
 * stack pointer on entry, x0 the result; the return address is in x30. */
#define LW_REG_ARGS 8
#define LW_CAPTURE_REGS(e, ctx)                                                  \
	do {                                                                     \
		for (int _i = 0; _i < 8; _i++)                                   \
			(e)->args[_i] = (ctx)->regs[_i];                         \
		(e)->args[8] = 0;                                                \
	} while (0)
#define LW_ARG0(ctx) ((ctx)->regs[0])
#define LW_ARG1(ctx) ((ctx)->regs[1])
#define LW_RC(ctx) ((ctx)->regs[0])
#define LW_IP(ctx) ((ctx)->pc)
#define LW_SP(ctx) ((ctx)->sp)
#define LW_STACK_ARGS(sp) (sp)
#define LW_LINK(ctx) ((ctx)->regs[30])

#endif
