/*
 * late-pool-pages: where the host pages of copies are, found from the copies
 * alone (docs/design.md, "Pages, not registrations").
 *
 * A pool is registered before the observer attaches (it cannot know it), then,
 * after it attached, the pool is loaded layer by layer (H2D), a few layers are
 * written back into it (D2H) and fresh pageable memory is copied in (H2D). The
 * end line carries host_page_node: the node every page of those host ranges is
 * on, as this process reads it with move_pages(2) on each of its own pages (-1
 * when they are on several nodes or one could not be read), and copies, the
 * number of copies made.
 *
 * With --hold it stops twice: before the copies ("ready PID", so the observer
 * can attach) and after them ("copied N", until a line on stdin), so that its
 * memory is still mapped while the observer locates the pages, as a server's
 * pool stays mapped while the server runs.
 */
#include "calls.h"
#include "kvpath.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)
#define WRITEBACKS 4

static struct truth_rec *copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
	struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dst, src, n, kind, s, -1);
	TCALL(r, cudaMemcpyAsync(dst, src, n, kind, s));
	return r;
}

/* The node of every page of [p, p+n), or -1 when they are on several nodes or a
 * page has none. move_pages with a NULL node list only reports. */
static int node_of_range(const void *p, size_t n)
{
	long ps = sysconf(_SC_PAGESIZE);
	uintptr_t first = (uintptr_t)p & ~(uintptr_t)(ps - 1), end = (uintptr_t)p + n;
	size_t count = (end - first + (size_t)ps - 1) / (size_t)ps;
	void **pages = calloc(count, sizeof *pages);
	int *status = calloc(count, sizeof *status);
	if (!pages || !status) {
		free(pages);
		free(status);
		return -1;
	}
	for (size_t i = 0; i < count; i++)
		pages[i] = (void *)(first + i * (size_t)ps);
	int node = -1;
	if (syscall(SYS_move_pages, 0, (unsigned long)count, pages, NULL, status, 0) == 0) {
		node = status[0];
		for (size_t i = 0; i < count && node >= 0; i++)
			if (status[i] != node)
				node = -1;
	} else {
		perror("kvpath: move_pages");
	}
	free(pages);
	free(status);
	return node < 0 ? -1 : node;
}

int sc_late_pool_pages(const struct opts *o, struct result *res)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	char *pool = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (pool == MAP_FAILED) {
		perror("mmap pool");
		return 1;
	}
	memset(pool, 0x5b, total);
	struct truth_rec *r = truth_new("cudaHostRegister", "host_register");
	r->ptr = (uintptr_t)pool;
	r->size = total;
	r->has_flags = 1;
	TCALL(r, cudaHostRegister(pool, total, cudaHostRegisterDefault));
	truth_note_mem(pool, total, MEM_PINNED, 1); /* before the observer attaches */
	char *dev = dev_alloc(total + 2 * MiB);
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	hold_point(o);

	int copies = 0;
	for (int i = 0; i < o->layers; i++, copies++)
		copy(dev + (size_t)i * lb, pool + (size_t)i * lb, lb, cudaMemcpyHostToDevice, s);
	int wbs = o->layers < WRITEBACKS ? o->layers : WRITEBACKS;
	for (int i = 0; i < wbs; i++, copies++) /* the device copy of layer i back over layer i */
		copy(pool + (size_t)i * lb, dev + (size_t)i * lb, lb, cudaMemcpyDeviceToHost, s);
	size_t pn = 2 * MiB; /* >= 1 MiB: malloc maps it anew, after the observer attached */
	char *fresh = malloc(pn);
	if (!fresh)
		return 1;
	memset(fresh, 0x5c, pn);
	copy(dev + total, fresh, pn, cudaMemcpyHostToDevice, s);
	copies++;
	stream_sync(s, NULL);

	int a = node_of_range(pool, total), b = node_of_range(fresh, pn);
	int node = a == b ? a : -1;
	if (o->hold) {
		printf("copied %d\n", copies);
		fflush(stdout);
		char line[64];
		(void)!fgets(line, sizeof line, stdin);
	}
	int bad = memcmp(dev, pool, total) != 0 || memcmp(dev + total, fresh, pn) != 0;
	if (bad)
		fprintf(stderr, "kvpath: data mismatch after late-pool-pages\n");
	snprintf(res->extra, sizeof res->extra, "\"host_page_node\":%d,\"copies\":%d", node, copies);

	free(fresh);
	CHECK(cudaStreamDestroy(s));
	dev_free(dev);
	host_unregister(pool);
	munmap(pool, total);
	return bad;
}
