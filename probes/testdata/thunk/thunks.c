/*
 * Fixture for probes/thunk_test.go: dispatch thunks shaped like NVIDIA's
 * libcuda exports (docs/design.md, "NVIDIA's real libraries"), and
 * look-alikes that must not be bypassed. Built by the test with
 *   gcc -O2 -fPIC -shared -o libthunks.so thunks.c
 * (and once more with -Wl,-z,pack-relative-relocs, which moves the
 * R_X86_64_RELATIVE relocations into .relr.dyn).
 *
 * Every function is wrapped in .cfi_startproc/.cfi_endproc so that
 * .eh_frame_hdr lists it as a function start, as it lists libcuda's.
 * Names starting with lw_ are exported thunks or functions; impl_* are
 * local (static) implementations, reachable only through their slot.
 */

/* An ordinary function: not a thunk. */
__attribute__((visibility("default"), noinline)) int lw_plain(int a, int b) { return a * b + 1; }

__asm__(
	/* The "library torn down" flag the guards compare, as libcuda's in .bss. */
	"	.local lw_flag\n"
	"	.comm lw_flag, 4, 4\n"

	/* impl NAME VALUE: a local function that begins push %rbp like libcuda's. */
	"	.macro impl name, value\n"
	"	.text\n"
	"	.type \\name, @function\n"
	"\\name:\n"
	"	.cfi_startproc\n"
	"	push %rbp\n"
	"	.cfi_def_cfa_offset 16\n"
	"	.cfi_offset %rbp, -16\n"
	"	mov %rsp, %rbp\n"
	"	.cfi_def_cfa_register %rbp\n"
	"	mov $\\value, %eax\n"
	"	pop %rbp\n"
	"	.cfi_def_cfa %rsp, 8\n"
	"	ret\n"
	"	.cfi_endproc\n"
	"	.size \\name, .-\\name\n"
	"	.endm\n"

	/* begin/end NAME: an exported function with unwind information. */
	"	.macro begin name\n"
	"	.text\n"
	"	.p2align 5\n"
	"	.globl \\name\n"
	"	.type \\name, @function\n"
	"\\name:\n"
	"	.cfi_startproc\n"
	"	.endm\n"
	"	.macro end name\n"
	"	.cfi_endproc\n"
	"	.size \\name, .-\\name\n"
	"	.endm\n"

	/* nvthunk NAME SLOT: NVIDIA's exact 30-byte shape,
	 * 81 3d <flag> 00 ba 1c 32 | 74 0c | ff 25 <slot> | 66 0f 1f 44 00 00 | b8 04 00 00 00 | c3 */
	"	.macro nvthunk name, slot\n"
	"	begin \\name\n"
	"	cmpl $0x321cba00, lw_flag(%rip)\n"
	"	je 1f\n"
	"	jmp *\\slot(%rip)\n"
	"	.byte 0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00\n" /* nopw 0x0(%rax,%rax,1), 6 bytes as in libcuda */
	"1:	mov $4, %eax\n"
	"	ret\n"
	"	end \\name\n"
	"	.endm\n"

	/* (a) the good thunk; slot in .data holds a local function's address:
	 * R_X86_64_RELATIVE, addend impl_good. */
	"	impl impl_good, 1\n"
	"	nvthunk lw_good, slot_good\n"

	/* (f) ENDBR64, then the same pattern. */
	"	impl impl_endbr, 2\n"
	"	begin lw_endbr\n"
	"	endbr64\n"
	"	cmpl $0x321cba00, lw_flag(%rip)\n"
	"	je 1f\n"
	"	jmp *slot_endbr(%rip)\n"
	"	.byte 0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"1:	mov $4, %eax\n"
	"	ret\n"
	"	end lw_endbr\n"

	/* A register guard (test %rdi,%rdi; je) writes only RFLAGS too. */
	"	impl impl_testreg, 3\n"
	"	begin lw_testreg\n"
	"	test %rdi, %rdi\n"
	"	je 1f\n"
	"	jmp *slot_testreg(%rip)\n"
	"1:	mov $1, %eax\n"
	"	ret\n"
	"	end lw_testreg\n"

	/* (b) like NVIDIA's cuMemsetD8 thunks: the guard zero-extends the
	 * value argument, so the implementation relies on a register the
	 * thunk wrote. */
	"	impl impl_writes_arg, 4\n"
	"	begin lw_writes_arg\n"
	"	cmpl $0x321cba00, lw_flag(%rip)\n"
	"	je 1f\n"
	"	movzbl %sil, %esi\n"
	"	jmp *slot_writes_arg(%rip)\n"
	"1:	mov $4, %eax\n"
	"	ret\n"
	"	end lw_writes_arg\n"

	/* A push before the jump moves the stack the implementation sees. */
	"	impl impl_push, 5\n"
	"	begin lw_push\n"
	"	push %rbp\n"
	"	jmp *slot_push(%rip)\n"
	"	end lw_push\n"

	/* A store to memory before the jump. */
	"	impl impl_store, 6\n"
	"	begin lw_store\n"
	"	movl $1, lw_flag(%rip)\n"
	"	jmp *slot_store(%rip)\n"
	"	end lw_store\n"

	/* A guard whose branch leaves the function. */
	"	impl impl_je_out, 7\n"
	"	begin lw_je_out\n"
	"	cmpl $0x321cba00, lw_flag(%rip)\n"
	"	je impl_good\n"
	"	jmp *slot_je_out(%rip)\n"
	"	end lw_je_out\n"

	/* (c) slot initialised to an imported function: R_X86_64_64 memcpy. */
	"	nvthunk lw_import, slot_import\n"

	/* (c') jmp through the GOT entry of an import: R_X86_64_GLOB_DAT memcpy. */
	"	begin lw_got\n"
	"	jmp *memcpy@GOTPCREL(%rip)\n"
	"	end lw_got\n"

	/* Slot bound by name to an exported (interposable) function of this
	 * library: R_X86_64_64 lw_exported_impl. */
	"	begin lw_exported_impl\n"
	"	push %rbp\n"
	"	pop %rbp\n"
	"	ret\n"
	"	end lw_exported_impl\n"
	"	nvthunk lw_interpose, slot_interpose\n"

	/* The same with a protected symbol, which cannot be interposed: the
	 * linker resolves it itself (R_X86_64_RELATIVE). */
	"	begin lw_protected_impl\n"
	"	push %rbp\n"
	"	pop %rbp\n"
	"	ret\n"
	"	end lw_protected_impl\n"
	"	.protected lw_protected_impl\n"
	"	nvthunk lw_protected, slot_protected\n"

	/* (d) slot holds an address inside a function, not its start. */
	"	nvthunk lw_mid, slot_mid\n"

	/* Slot holds the address of data. */
	"	nvthunk lw_data, slot_data\n"

	/* Slot with no relocation: its run-time value is not in the file. */
	"	nvthunk lw_norel, slot_norel\n"

	/* Slot in .text: code, not a data word (left without a relocation,
	 * which would make the library DT_TEXTREL). */
	"	begin lw_textslot\n"
	"	jmp *slot_text(%rip)\n"
	"	.p2align 3\n"
	"slot_text:\n"
	"	.quad 0\n"
	"	end lw_textslot\n"

	/* Slot set at load time by an IFUNC resolver: R_X86_64_IRELATIVE. */
	"	.type ifunc_pick, @function\n"
	"ifunc_pick:\n"
	"	.cfi_startproc\n"
	"	lea impl_good(%rip), %rax\n"
	"	ret\n"
	"	.cfi_endproc\n"
	"	.size ifunc_pick, .-ifunc_pick\n"
	"	.type lw_ifunc_sym, @gnu_indirect_function\n"
	"	.set lw_ifunc_sym, ifunc_pick\n"
	"	nvthunk lw_ifunc, slot_ifunc\n"

	/* (e') a direct tail jump is not a dispatch through a slot. */
	"	begin lw_direct\n"
	"	jmp lw_plain\n"
	"	end lw_direct\n"

	/* More guard instructions than the walk looks at. */
	"	begin lw_far\n"
	"	.rept 9\n"
	"	test %edi, %edi\n"
	"	.endr\n"
	"	jmp *slot_good(%rip)\n"
	"	end lw_far\n"

	"	.data\n"
	"	.p2align 3\n"
	"slot_good:		.quad impl_good\n"
	"slot_endbr:		.quad impl_endbr\n"
	"slot_testreg:		.quad impl_testreg\n"
	"slot_writes_arg:	.quad impl_writes_arg\n"
	"slot_push:		.quad impl_push\n"
	"slot_store:		.quad impl_store\n"
	"slot_je_out:		.quad impl_je_out\n"
	"slot_import:		.quad memcpy\n"
	"slot_interpose:		.quad lw_exported_impl\n"
	"slot_protected:		.quad lw_protected_impl\n"
	"slot_mid:		.quad impl_good+1\n"
	"slot_data:		.quad slot_good\n"
	"slot_norel:		.quad 0\n"
	"slot_ifunc:		.quad lw_ifunc_sym\n"
	"	.text\n"
);
