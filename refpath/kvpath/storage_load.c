/*
 * storage-load: the L3 → L2 → L1 leg of SGLang HiCache as a file backend
 * with direct I/O does it (seed 000 checklist, "存储后端能否直接写进已注册的
 * Host Pool"): each layer is read from a file on this machine's disk straight
 * into the registered host pool with pread(2), then loaded H2D from the pool
 * (one event per layer, as load_to_device_per_layer does).
 *
 * The file is written first, in LW_REF_STORAGE_DIR (required), and opened
 * O_DIRECT when the file system allows it, else plainly: then the reads go
 * through the page cache and are not storage DMA into the pool, and the end
 * line says so ("direct":0). The pool is bound to node 0 (mbind) before its
 * pages are touched, so the selftest knows where it is before it runs.
 *
 * With --hold it stops before the reads ("ready PID pool 0xADDR") and after them ("read
 * N", until a line on stdin), so that its fds and pool are still there while
 * the observer resolves the reads. The end line carries storage_reads,
 * storage_bytes, direct, storage_dev ("MAJ:MIN" of the file's file system)
 * and pool_node (every pool page's node, -1 several or unreadable).
 */
#include "calls.h"
#include "kvpath.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define LW_MPOL_BIND 2

/* The node of every page of [p, p+n), -1 when several or unreadable. */
static int pool_node(const char *p, size_t n)
{
	long ps = sysconf(_SC_PAGESIZE);
	size_t count = n / (size_t)ps;
	void **pages = calloc(count, sizeof *pages);
	int *status = calloc(count, sizeof *status);
	int node = -1;
	if (pages && status) {
		for (size_t i = 0; i < count; i++)
			pages[i] = (void *)(p + i * (size_t)ps);
		if (syscall(SYS_move_pages, 0, (unsigned long)count, pages, NULL, status, 0) == 0) {
			node = status[0];
			for (size_t i = 0; i < count && node >= 0; i++)
				if (status[i] != node)
					node = -1;
		}
	}
	free(pages);
	free(status);
	return node < 0 ? -1 : node;
}

/* A pool whose pages are bound to node 0, populated, then registered. */
static char *node0_pool(size_t n)
{
	char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap pool");
		exit(1);
	}
	unsigned long mask = 1;
	if (syscall(SYS_mbind, p, n, LW_MPOL_BIND, &mask, 8 * sizeof mask, 0) != 0 && errno != ENOSYS)
		perror("kvpath: mbind node 0");
	memset(p, 0, n);
	host_register(p, n, 0);
	return p;
}

static int write_file(const char *path, size_t total, size_t lb)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0) {
		perror(path);
		return -1;
	}
	char *buf = malloc(lb);
	if (!buf)
		return -1;
	for (size_t off = 0; off < total; off += lb) {
		memset(buf, 0x30 + (int)(off / lb) % 64, lb);
		if (write(fd, buf, lb) != (ssize_t)lb) {
			perror("write");
			return -1;
		}
	}
	free(buf);
	if (fsync(fd) != 0)
		perror("fsync");
	return close(fd);
}

/*
 * kv_file_open writes a KV file of o's layers under LW_REF_STORAGE_DIR (layer i's bytes
 * are 0x30 + i % 64) and opens it for reading, O_DIRECT where the filesystem allows it
 * (*direct says which: page-cache reads are not storage DMA). -1 after a message.
 */
int kv_file_open(const struct opts *o, const char *stem, char *path, size_t pathn, int *direct, struct stat *st)
{
	const char *dir = getenv("LW_REF_STORAGE_DIR");
	if (!dir) {
		fprintf(stderr, "kvpath: %s needs LW_REF_STORAGE_DIR\n", o->scenario);
		return -1;
	}
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	snprintf(path, pathn, "%s/%s-%d.bin", dir, stem, (int)getpid());
	if (write_file(path, total, lb) != 0)
		return -1;
	*direct = 1;
	int fd = open(path, O_RDONLY | O_DIRECT);
	if (fd < 0 && errno == EINVAL) {
		*direct = 0;
		fd = open(path, O_RDONLY);
	}
	if (fd < 0 || fstat(fd, st) != 0) {
		perror(path);
		return -1;
	}
	return fd;
}

int sc_storage_load(const struct opts *o, struct result *res)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	char path[4096];
	int direct;
	struct stat st;
	int fd = kv_file_open(o, "kv", path, sizeof path, &direct, &st);
	if (fd < 0)
		return 1;
	char *pool = node0_pool(total);
	char *dev = dev_alloc(total);
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	if (o->hold) { /* hold_point's, with the pool's address for the observer */
		printf("ready %d pool 0x%lx\n", (int)getpid(), (unsigned long)(uintptr_t)pool);
		fflush(stdout);
		char line[64];
		(void)!fgets(line, sizeof line, stdin);
	}

	int reads = 0;
	for (int i = 0; i < o->layers; i++) {
		size_t off = (size_t)i * lb;
		if (pread(fd, pool + off, lb, (off_t)off) != (ssize_t)lb) {
			perror("pread");
			return 1;
		}
		reads++;
		struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dev + off, pool + off, lb, cudaMemcpyHostToDevice, s, i);
		TCALL(r, cudaMemcpyAsync(dev + off, pool + off, lb, cudaMemcpyHostToDevice, s));
	}
	stream_sync(s, NULL);
	int node = pool_node(pool, total);
	if (o->hold) {
		printf("read %d\n", reads);
		fflush(stdout);
		char line[64];
		(void)!fgets(line, sizeof line, stdin);
	}
	int bad = 0;
	for (int i = 0; i < o->layers && !bad; i++)
		bad = dev[(size_t)i * lb] != 0x30 + i % 64 || memcmp(dev + (size_t)i * lb, pool + (size_t)i * lb, lb) != 0;
	if (bad)
		fprintf(stderr, "kvpath: data mismatch after storage-load\n");
	snprintf(res->extra, sizeof res->extra,
		 "\"storage_reads\":%d,\"storage_bytes\":%zu,\"direct\":%d,\"storage_dev\":\"%u:%u\",\"pool_node\":%d", reads,
		 total, direct, major(st.st_dev), minor(st.st_dev), node);
	close(fd);
	unlink(path);
	CHECK(cudaStreamDestroy(s));
	dev_free(dev);
	host_unregister(pool);
	munmap(pool, total);
	return bad;
}
