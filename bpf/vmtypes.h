/* The kernel types the programs read through mappings, relocated by CO-RE:
 * only the fields a program names are read, their offsets from the kernel's
 * BTF (lanewatch.bpf.c's caller lookup, hold.bpf.c's walk of a process's
 * mapped files). */
#ifndef LANEWATCH_VMTYPES_H
#define LANEWATCH_VMTYPES_H

struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));
struct dentry {
	struct qstr d_name;
} __attribute__((preserve_access_index));
struct path {
	struct dentry *dentry;
} __attribute__((preserve_access_index));
struct super_block {
	unsigned int s_dev;
} __attribute__((preserve_access_index));
struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));
struct file {
	struct path f_path;
	struct inode *f_inode;
} __attribute__((preserve_access_index));
struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	struct file *vm_file;
} __attribute__((preserve_access_index));

#endif
