/*
 * storage-writeback: HiCache prefetching one request's KV from storage (L3 →
 * L2) while it writes another's back from the GPU (L1 → L2, write_stream):
 * storage reads and D2H at once. Both travel up a switch uplink the disk and
 * the GPU share (seed 000 checklist, "NVMe 和 GPU 是否共用同一个 Switch 上行口";
 * reads and H2D would not contend: opposite directions).
 *
 * A reader thread preads each layer O_DIRECT from a file in
 * LW_REF_STORAGE_DIR (required) into the first half of a registered pool
 * while the main thread copies each layer D2H into the second half, then
 * synchronises. With --hold it stops before ("ready PID") and after both
 * ("done", until a line on stdin), so the observer reads the block device
 * counters around exactly that work. The end line carries storage_bytes,
 * d2h_bytes, direct and storage_dev.
 */
#include "calls.h"
#include "kvpath.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

struct reader {
	int fd, layers;
	size_t lb;
	char *dst;
	int failed;
};

static void *read_layers(void *arg)
{
	struct reader *r = arg;
	for (int i = 0; i < r->layers; i++) {
		size_t off = (size_t)i * r->lb;
		if (pread(r->fd, r->dst + off, r->lb, (off_t)off) != (ssize_t)r->lb) {
			perror("pread");
			r->failed = 1;
			return NULL;
		}
	}
	return NULL;
}

static void hold(const struct opts *o, const char *line)
{
	if (!o->hold)
		return;
	printf("%s\n", line);
	fflush(stdout);
	char in[64];
	(void)!fgets(in, sizeof in, stdin);
}

int sc_storage_writeback(const struct opts *o, struct result *res)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	char path[4096];
	int direct;
	struct stat st;
	int fd = kv_file_open(o, "kv-wb", path, sizeof path, &direct, &st);
	if (fd < 0)
		return 1;
	char *pool = pinned_pool(2 * total, 0);
	char *dev = dev_alloc(total);
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	char line[64];
	snprintf(line, sizeof line, "ready %d", (int)getpid());
	hold(o, line);

	struct reader r = {fd, o->layers, lb, pool, 0};
	pthread_t t;
	if (pthread_create(&t, NULL, read_layers, &r) != 0) {
		perror("pthread_create");
		return 1;
	}
	for (int i = 0; i < o->layers; i++) {
		size_t off = (size_t)i * lb;
		struct truth_rec *c = truth_copy("cudaMemcpyAsync", "copy", pool + total + off, dev + off, lb, cudaMemcpyDeviceToHost, s, i);
		TCALL(c, cudaMemcpyAsync(pool + total + off, dev + off, lb, cudaMemcpyDeviceToHost, s));
	}
	stream_sync(s, NULL);
	pthread_join(t, NULL);
	hold(o, "done");
	int bad = r.failed || pool[0] != 0x30 || pool[total - 1] != 0x30 + (o->layers - 1) % 64; /* kv_file_open's layers */
	if (bad)
		fprintf(stderr, "kvpath: storage-writeback read the wrong data\n");
	snprintf(res->extra, sizeof res->extra, "\"storage_bytes\":%zu,\"d2h_bytes\":%zu,\"direct\":%d,\"storage_dev\":\"%u:%u\"", total,
		 total, direct, major(st.st_dev), minor(st.st_dev));
	close(fd);
	unlink(path);
	CHECK(cudaStreamDestroy(s));
	dev_free(dev);
	host_unregister(pool);
	return bad;
}
