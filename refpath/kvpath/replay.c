/*
 * replay: a real CUDA call stream, from a PyTorch profiler (Kineto) trace, made
 * again through the reference runtime (`kvpath --scenario replay --script FILE`;
 * the selftest writes the script from the trace, selftest/kineto). Each of the
 * trace's host threads is a thread here; each makes its calls at the times the
 * trace says (from a common start, so the threads keep their interleaving; a
 * thread behind its time goes on at once), on as many streams as the trace used:
 *
 *   copies        from pinned memory (cudaHostAlloc), pageable memory (malloc) or
 *                 device memory (cudaMalloc), as CUPTI recorded each; the blocking
 *                 forms as cudaMemcpy, the others as cudaMemcpyAsync
 *   kernels       the stand-in kernel, busy on its stream for the GPU time the
 *                 trace's kernel took
 *   graphs        each launch's graph captured at set-up (cudaStreamBeginCapture on a
 *                 capture stream: the stand-in kernel for the span the graph's work
 *                 took, then the copies CUPTI ran inside it; truth captured_launch,
 *                 captured_copy), instantiated, and launched with cudaGraphLaunch
 *                 (truth graph_launch): its copies have no call of their own
 *   memsets       cudaMemsetAsync of the trace's bytes
 *   events        record, query, synchronize, stream wait; stream and device syncs
 *
 * The script (line-oriented, '#' comments):
 *
 *   replay 1
 *   streams N                       trace streams 0..N-1; -1 is the legacy stream
 *   events N
 *   buffers PINNED PAGEABLE DEVICE  bytes of each (the largest copy of each)
 *   graphs N                        then N graphs, each a line and its copies:
 *   graph GPU_NS COPIES             then COPIES lines: H2D|D2H|D2D pinned|pageable|device BYTES
 *   thread CALLS                    then CALLS lines, one per call:
 *   AT_NS copy sync|async H2D|D2H|D2D pinned|pageable|device BYTES STREAM
 *   AT_NS kernel STREAM GPU_NS
 *   AT_NS graph STREAM GRAPH        cudaGraphLaunch of graph GRAPH (0..N-1)
 *   AT_NS memset STREAM BYTES
 *   AT_NS event_record EVENT STREAM
 *   AT_NS event_query EVENT
 *   AT_NS event_sync EVENT
 *   AT_NS stream_wait STREAM EVENT
 *   AT_NS stream_sync STREAM
 *   AT_NS device_sync
 *   end
 *
 * The truth has every call made; cudaEventQuery's cudaErrorNotReady is its answer.
 */
#include "calls.h"
#include "kvpath.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RP_MAX_THREADS 256
#define RP_MAX_STREAMS 1024
#define RP_MAX_EVENTS (1 << 20)
#define RP_MAX_CALLS (1 << 22)
#define RP_MAX_BUFFER (1ull << 32)

enum rp_op { RP_COPY, RP_KERNEL_OP, RP_GRAPH, RP_MEMSET, RP_RECORD, RP_QUERY, RP_EVSYNC, RP_WAIT, RP_SSYNC, RP_DSYNC };

struct rp_call {
	uint64_t at_ns;
	enum rp_op op;
	int sync;      /* copy: the blocking form */
	int kind;      /* copy: cudaMemcpyKind */
	int host;      /* copy: 0 pinned, 1 pageable (the host side) */
	int stream;    /* -1: the legacy stream */
	int event;
	uint64_t n;    /* copy, memset: bytes; kernel: GPU ns; graph: its index */
};

/* A graph: the stand-in kernel for gpu_ns, then its copies (rp_call: kind, host, n). */
struct rp_graph {
	uint64_t gpu_ns;
	struct rp_call *copies;
	size_t ncopies;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
};

struct rp_thread {
	pthread_t t;
	struct rp_call *calls;
	size_t ncalls;
};

static struct {
	int nstreams, nevents, nthreads, ngraphs;
	struct rp_graph *graphs;
	cudaStream_t *streams;
	cudaEvent_t *events;
	char *pinned, *pageable, *dev_a, *dev_b;
	uint64_t pinned_n, pageable_n, device_n;
	struct rp_thread threads[RP_MAX_THREADS];
	pthread_barrier_t start;
	uint64_t t0;
	const char *path;
} R;

static void die(int line, const char *what)
{
	fprintf(stderr, "kvpath replay: %s:%d: %s\n", R.path, line, what);
	exit(2);
}

static cudaStream_t stream_at(int i) { return i < 0 ? NULL : R.streams[i]; }

/* captured: issued on a capturing stream, recorded into its graph, not run */
static void rp_launch(cudaStream_t s, uint64_t ns, int captured)
{
	int64_t v = (int64_t)ns;
	void *out = R.dev_a;
	void *args[] = {&out, &v};
	dim3 g = {1, 1, 1}, b = {32, 1, 1};
	struct truth_rec *r = truth_new("cudaLaunchKernel", captured ? "captured_launch" : "launch");
	r->stream = (uintptr_t)s;
	r->has_stream = 1;
	r->layer = -1;
	r->kernel = compute_kernel_name; /* the compute stand-in (computeoverlap.c) */
	if (!captured)
		truth_arm_times(&r, 1);
	TCALL(r, cudaLaunchKernel(compute_kernel_stub, g, b, args, 0, s));
}

static void rp_copy_on(const struct rp_call *c, cudaStream_t s, int captured)
{
	void *dst, *src;
	char *host = c->host ? R.pageable : R.pinned;
	switch (c->kind) {
	case cudaMemcpyHostToDevice:
		dst = R.dev_a, src = host;
		break;
	case cudaMemcpyDeviceToHost:
		dst = host, src = R.dev_a;
		break;
	default:
		dst = R.dev_b, src = R.dev_a;
		break;
	}
	if (captured) {
		struct truth_rec *r = truth_copy_unarmed("cudaMemcpyAsync", "captured_copy", dst, src, c->n, c->kind, s, -1);
		TCALL(r, cudaMemcpyAsync(dst, src, c->n, (enum cudaMemcpyKind)c->kind, s));
		return;
	}
	if (c->sync) {
		struct truth_rec *r = truth_copy("cudaMemcpy", "copy", dst, src, c->n, c->kind, NULL, -1);
		TCALL(r, cudaMemcpy(dst, src, c->n, (enum cudaMemcpyKind)c->kind));
		return;
	}
	struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dst, src, c->n, c->kind, s, -1);
	TCALL(r, cudaMemcpyAsync(dst, src, c->n, (enum cudaMemcpyKind)c->kind, s));
}

static void rp_do(const struct rp_call *c)
{
	struct truth_rec *r;
	switch (c->op) {
	case RP_COPY:
		rp_copy_on(c, stream_at(c->stream), 0);
		break;
	case RP_KERNEL_OP:
		rp_launch(stream_at(c->stream), c->n, 0);
		break;
	case RP_GRAPH:
		r = truth_new("cudaGraphLaunch", "graph_launch");
		r->ptr = (uintptr_t)R.graphs[c->n].exec;
		r->stream = (uintptr_t)stream_at(c->stream);
		r->has_stream = 1;
		r->layer = -1;
		TCALL(r, cudaGraphLaunch(R.graphs[c->n].exec, stream_at(c->stream)));
		break;
	case RP_MEMSET:
		r = truth_new("cudaMemsetAsync", "memset");
		r->ptr = (uintptr_t)R.dev_b;
		r->size = c->n;
		r->stream = (uintptr_t)stream_at(c->stream);
		r->has_stream = 1;
		TCALL(r, cudaMemsetAsync(R.dev_b, 0, c->n, stream_at(c->stream)));
		break;
	case RP_RECORD:
		event_record(R.events[c->event], stream_at(c->stream), -1);
		break;
	case RP_QUERY:
		r = truth_new("cudaEventQuery", "event_query");
		r->event = (uintptr_t)R.events[c->event];
		r->has_event = 1;
		r->t_call_ns = truth_now_ns();
		r->ret = cudaEventQuery(R.events[c->event]);
		r->t_return_ns = truth_now_ns();
		if (r->ret != cudaSuccess && r->ret != cudaErrorNotReady) {
			fprintf(stderr, "kvpath replay: cudaEventQuery returned %d\n", r->ret);
			exit(1);
		}
		break;
	case RP_EVSYNC:
		r = truth_new("cudaEventSynchronize", "event_sync");
		r->event = (uintptr_t)R.events[c->event];
		r->has_event = 1;
		TCALL(r, cudaEventSynchronize(R.events[c->event]));
		break;
	case RP_WAIT:
		stream_wait_event(stream_at(c->stream), R.events[c->event], -1);
		break;
	case RP_SSYNC:
		stream_sync(stream_at(c->stream), NULL);
		break;
	case RP_DSYNC:
		r = truth_new("cudaDeviceSynchronize", "ctx_sync");
		TCALL(r, cudaDeviceSynchronize());
		break;
	}
}

static void *rp_thread_main(void *arg)
{
	struct rp_thread *t = arg;
	pthread_barrier_wait(&R.start);
	for (size_t i = 0; i < t->ncalls; i++) {
		uint64_t at = R.t0 + t->calls[i].at_ns;
		if (truth_now_ns() < at) {
			struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull), .tv_nsec = (long)(at % 1000000000ull)};
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL))
				;
		}
		rp_do(&t->calls[i]);
	}
	return NULL;
}

static int word_is(const char *w, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(w, names[i]))
			return i;
	return -1;
}

/* A copy's direction, host memory and bytes; nonzero if they are not a copy. */
static int copy_words(struct rp_call *c, const char *dirw, const char *hostw, unsigned long long n)
{
	static const char *const dirs[] = {"H2D", "D2H", "D2D"}, *const hosts[] = {"pinned", "pageable", "device"};
	int dir = word_is(dirw, dirs, 3), h = word_is(hostw, hosts, 3);
	if (dir < 0 || h < 0 || n == 0 || (dir == 2) != (h == 2))
		return 1;
	c->op = RP_COPY, c->kind = dir + 1, c->host = h == 1, c->n = n;
	return 0;
}

static int copy_fits(const struct rp_call *c)
{
	uint64_t cap = c->kind == cudaMemcpyDeviceToDevice ? R.device_n : c->host ? R.pageable_n : R.pinned_n;
	return c->n <= cap && c->n <= R.device_n;
}

/* One call line; dies naming the line on anything it cannot take. */
static void parse_call(char *s, int line, struct rp_call *c)
{
	static const char *const ops[] = {"copy", "kernel", "graph", "memset", "event_record", "event_query",
					  "event_sync", "stream_wait", "stream_sync", "device_sync"};
	char op[32], a[16] = "", b[16] = "", d[16] = "";
	unsigned long long at, n = 0;
	int x = -1, y = -1, k;
	if (sscanf(s, "%llu %31s", &at, op) != 2 || (k = word_is(op, ops, 10)) < 0)
		die(line, "want AT_NS and an op");
	*c = (struct rp_call){.at_ns = at, .op = (enum rp_op)k, .stream = -1};
	char *rest = strstr(s, op) + strlen(op);
	int got;
	switch (c->op) {
	case RP_COPY: {
		static const char *const forms[] = {"async", "sync"};
		got = sscanf(rest, "%15s %15s %15s %llu %d", a, b, d, &n, &x);
		int f = word_is(a, forms, 2);
		if (got != 5 || f < 0 || copy_words(c, b, d, n))
			die(line, "want copy sync|async H2D|D2H|D2D pinned|pageable|device BYTES STREAM");
		c->sync = f, c->stream = x;
		break;
	}
	case RP_KERNEL_OP:
	case RP_GRAPH:
	case RP_MEMSET:
		if (sscanf(rest, "%d %llu", &x, &n) != 2)
			die(line, "want STREAM and a number");
		c->stream = x, c->n = n;
		if (c->op == RP_GRAPH && n >= (unsigned long long)R.ngraphs)
			die(line, "graph out of range");
		break;
	case RP_RECORD:
		if (sscanf(rest, "%d %d", &y, &x) != 2)
			die(line, "want EVENT STREAM");
		c->event = y, c->stream = x;
		break;
	case RP_QUERY:
	case RP_EVSYNC:
		if (sscanf(rest, "%d", &y) != 1)
			die(line, "want EVENT");
		c->event = y;
		break;
	case RP_WAIT:
		if (sscanf(rest, "%d %d", &x, &y) != 2)
			die(line, "want STREAM EVENT");
		c->stream = x, c->event = y;
		break;
	case RP_SSYNC:
		if (sscanf(rest, "%d", &x) != 1)
			die(line, "want STREAM");
		c->stream = x;
		break;
	case RP_DSYNC:
		break;
	}
	if (c->stream < -1 || c->stream >= R.nstreams)
		die(line, "stream out of range");
	if ((c->op == RP_RECORD || c->op == RP_QUERY || c->op == RP_EVSYNC || c->op == RP_WAIT) &&
	    (c->event < 0 || c->event >= R.nevents))
		die(line, "event out of range");
	if (c->op == RP_COPY && !copy_fits(c))
		die(line, "copy larger than its buffer");
	if (c->op == RP_MEMSET && c->n > R.device_n)
		die(line, "memset larger than the device buffer");
}

static void read_script(const char *path)
{
	R.path = path;
	FILE *f = fopen(path, "r");
	if (!f) {
		perror(path);
		exit(2);
	}
	char s[512];
	int line = 0, version = 0, ended = 0;
	struct rp_thread *cur = NULL;
	struct rp_graph *gcur = NULL;
	size_t want = 0, total = 0, gwant = 0;
	int gdefs = 0;
	unsigned long long p, g, d;
	while (fgets(s, sizeof s, f)) {
		line++;
		if (!strchr(s, '\n') && !feof(f))
			die(line, "line too long");
		char *h = s + strspn(s, " \t");
		if (*h == '#' || *h == '\n' || !*h)
			continue;
		if (ended)
			die(line, "text after end");
		if (cur && cur->ncalls < want) {
			parse_call(h, line, &cur->calls[cur->ncalls++]);
			continue;
		}
		if (gcur && gcur->ncopies < gwant) {
			char dw[16], hw[16];
			unsigned long long bytes;
			struct rp_call *c = &gcur->copies[gcur->ncopies++];
			if (sscanf(h, "%15s %15s %llu", dw, hw, &bytes) != 3 || copy_words(c, dw, hw, bytes) || !copy_fits(c))
				die(line, "want a graph's copy: H2D|D2H|D2D pinned|pageable|device BYTES (within its buffer)");
			continue;
		}
		int n;
		unsigned long long gns;
		unsigned long long calls;
		if (sscanf(h, "replay %d", &version) == 1) {
			if (version != 1)
				die(line, "want replay 1");
		} else if (!version) {
			die(line, "want replay 1 first");
		} else if (sscanf(h, "streams %d", &n) == 1) {
			if (n < 0 || n > RP_MAX_STREAMS || R.streams)
				die(line, "bad streams");
			R.nstreams = n;
			R.streams = calloc((size_t)n + 1, sizeof *R.streams);
		} else if (sscanf(h, "events %d", &n) == 1) {
			if (n < 0 || n > RP_MAX_EVENTS || R.events)
				die(line, "bad events");
			R.nevents = n;
			R.events = calloc((size_t)n + 1, sizeof *R.events);
		} else if (sscanf(h, "buffers %llu %llu %llu", &p, &g, &d) == 3) {
			if (p > RP_MAX_BUFFER || g > RP_MAX_BUFFER || d > RP_MAX_BUFFER)
				die(line, "buffer too large");
			R.pinned_n = p, R.pageable_n = g, R.device_n = d;
		} else if (sscanf(h, "graphs %d", &n) == 1) {
			if (n < 0 || n > RP_MAX_EVENTS || R.graphs || !R.device_n)
				die(line, "bad graphs (after buffers, once)");
			R.ngraphs = n;
			R.graphs = calloc((size_t)n + 1, sizeof *R.graphs);
		} else if (sscanf(h, "graph %llu %llu", &gns, &calls) == 2) {
			if (!R.graphs || gdefs == R.ngraphs || calls > RP_MAX_CALLS || (total += calls) > RP_MAX_CALLS)
				die(line, "graph beyond graphs N");
			gcur = &R.graphs[gdefs++];
			gcur->gpu_ns = gns;
			gcur->copies = calloc(calls + 1, sizeof *gcur->copies);
			gwant = calls;
		} else if (sscanf(h, "thread %llu", &calls) == 1) {
			if (!R.streams || !R.events || gdefs != R.ngraphs)
				die(line, "thread before streams, events and every graph");
			if (R.nthreads == RP_MAX_THREADS || calls > RP_MAX_CALLS || (total += calls) > RP_MAX_CALLS)
				die(line, "too many threads or calls");
			cur = &R.threads[R.nthreads++];
			cur->calls = calloc(calls + 1, sizeof *cur->calls);
			want = calls;
		} else if (!strncmp(h, "end", 3)) {
			ended = 1;
		} else {
			die(line, "unknown line");
		}
	}
	fclose(f);
	if (!ended || (cur && cur->ncalls < want) || (gcur && gcur->ncopies < gwant) || gdefs != R.ngraphs)
		die(line, "script ends early (no end line)");
}

/* Each graph captured on a stream of its own and instantiated, before the replay. */
static void capture_graphs(void)
{
	cudaStream_t cs;
	CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
	for (int i = 0; i < R.ngraphs; i++) {
		struct rp_graph *g = &R.graphs[i];
		struct truth_rec *r = truth_new("cudaStreamBeginCapture", "capture_begin");
		r->stream = (uintptr_t)cs;
		r->has_stream = 1;
		TCALL(r, cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
		rp_launch(cs, g->gpu_ns, 1);
		for (size_t j = 0; j < g->ncopies; j++) {
			struct rp_call c = g->copies[j];
			c.stream = -2; /* the capture stream */
			rp_copy_on(&c, cs, 1);
		}
		r = truth_new("cudaStreamEndCapture", "capture_end");
		r->stream = (uintptr_t)cs;
		r->has_stream = 1;
		TCALL(r, cudaStreamEndCapture(cs, &g->graph));
		CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
	}
	CHECK(cudaStreamDestroy(cs));
}

static char *host_alloc_rec(size_t n)
{
	void *p = NULL;
	struct truth_rec *r = truth_new("cudaHostAlloc", "host_alloc");
	r->size = n;
	r->has_flags = 1;
	TCALL(r, cudaHostAlloc(&p, n, cudaHostAllocDefault));
	r->ptr = (uintptr_t)p;
	truth_note_mem(p, n, MEM_PINNED, 0);
	memset(p, 0x5a, n);
	return p;
}

int sc_replay(const struct opts *o, struct result *res)
{
	if (!o->script) {
		fprintf(stderr, "kvpath: replay wants --script FILE\n");
		return 2;
	}
	read_script(o->script);
	/* one byte at least: a trace without copies of a kind still gets a buffer */
	R.pinned = host_alloc_rec(R.pinned_n ? R.pinned_n : 1);
	R.pageable = malloc(R.pageable_n ? R.pageable_n : 1); /* ordinary memory: pageable */
	if (!R.pageable) {
		perror("malloc");
		return 1;
	}
	memset(R.pageable, 0x5a, R.pageable_n ? R.pageable_n : 1);
	R.dev_a = dev_alloc(R.device_n ? R.device_n : 1);
	R.dev_b = dev_alloc(R.device_n ? R.device_n : 1);
	for (int i = 0; i < R.nstreams; i++)
		CHECK(cudaStreamCreateWithFlags(&R.streams[i], cudaStreamNonBlocking));
	for (int i = 0; i < R.nevents; i++)
		CHECK(cudaEventCreateWithFlags(&R.events[i], cudaEventDisableTiming));
	if (R.ngraphs)
		capture_graphs();
	hold_point(o);

	pthread_barrier_init(&R.start, NULL, (unsigned)R.nthreads + 1);
	for (int i = 0; i < R.nthreads; i++)
		if (pthread_create(&R.threads[i].t, NULL, rp_thread_main, &R.threads[i])) {
			perror("pthread_create");
			return 1;
		}
	R.t0 = truth_now_ns();
	pthread_barrier_wait(&R.start);
	for (int i = 0; i < R.nthreads; i++)
		pthread_join(R.threads[i].t, NULL);
	uint64_t took = truth_now_ns() - R.t0;
	struct truth_rec *r = truth_new("cudaDeviceSynchronize", "ctx_sync"); /* the process's end: everything done */
	TCALL(r, cudaDeviceSynchronize());
	snprintf(res->extra, sizeof res->extra, "\"threads\":%d,\"streams\":%d,\"graphs\":%d,\"replay_ns\":%llu",
		 R.nthreads, R.nstreams, R.ngraphs, (unsigned long long)took);

	for (int i = 0; i < R.ngraphs; i++) {
		CHECK(cudaGraphExecDestroy(R.graphs[i].exec));
		CHECK(cudaGraphDestroy(R.graphs[i].graph));
	}
	for (int i = 0; i < R.nevents; i++)
		CHECK(cudaEventDestroy(R.events[i]));
	for (int i = 0; i < R.nstreams; i++)
		CHECK(cudaStreamDestroy(R.streams[i]));
	dev_free(R.dev_a);
	dev_free(R.dev_b);
	free(R.pageable);
	return 0;
}
