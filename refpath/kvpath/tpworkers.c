/*
 * tp-workers (docs/design.md, "Placement"; issue 11): tensor-parallel workers as
 * SGLang and vLLM start them. The parent starts one worker process per rank (fork
 * and exec of kvpath itself, LW_REF_TP_RANK=<rank>), each seeing every reference GPU
 * (LW_REF_GPUS: three GPUs named tpw-<pid>-N unless set, removed at the end), and
 * waits for them. Worker `rank` of R, on D devices, A = rank % D and B = (rank+1) % D:
 *
 *  - rank 0 first asks the PCI bus id of every device (cudaDeviceGetPCIBusId), as
 *    NCCL's initialisation does; the other ranks never do;
 *  - its main thread calls cudaSetDevice(A), registers a pinned pool, allocates a
 *    buffer (device A) and copies `layers` H2D into it and one D2H back;
 *  - a loader thread calls cudaSetDevice(B), allocates its own buffer (device B), copies
 *    H2D into it, then H2D into the main thread's buffer: device A's memory, copied
 *    while device B is current;
 *  - rank 1 copies the loader's buffer into the main thread's with
 *    cudaMemcpyPeerAsync (B to A: the destination's GPU);
 *  - the last rank starts a thread that never sets a device: its first runtime call
 *    makes device 0 current (CUDA's implicit device), and it allocates and copies there.
 *
 * With --hold the parent holds its workers once they are done (before they exit): it
 * prints "copied <pid> <copies>" for each worker, then "held", and releases them all
 * on a line on its stdin, so an observer can finish with live processes.
 *
 * Threads run one after another, so the truth's order is the submission order. Each
 * copy's truth line names its GPU ("gpu": the PCI address of the device that owns
 * the copy's device pointer, as refcudaDeviceBusId writes it): exactly what an
 * observer must report. Worker truth files are the parent's --truth with "-rank<r>"
 * before ".jsonl"; the parent's own truth has no call and an end line with "ranks"
 * and "devices".
 */
#include "calls.h"
#include "kvpath.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define TP_MAX_DEVICES 8

static char bus[TP_MAX_DEVICES][16];

/* The PCI address an observer must report for device dev. */
static const char *gpu_of(int dev)
{
	if (dev < 0 || dev >= TP_MAX_DEVICES || refcudaDeviceBusId(dev, bus[dev], sizeof bus[dev]) != 0) {
		fprintf(stderr, "kvpath: tp-workers: no device %d\n", dev);
		exit(1);
	}
	return bus[dev];
}

static const char *const device_phase[TP_MAX_DEVICES] = {"device 0", "device 1", "device 2", "device 3",
							   "device 4", "device 5", "device 6", "device 7"};

static void set_device(int dev)
{
	struct truth_rec *r = truth_new("cudaSetDevice", "set_device");
	r->phase = device_phase[dev];
	TCALL(r, cudaSetDevice(dev));
}

static void tp_copy(const char *api, const char *op, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
		    cudaStream_t s, int dev)
{
	struct truth_rec *r = truth_copy(api, op, dst, src, n, kind, s, -1);
	r->gpu = gpu_of(dev);
	TCALL(r, cudaMemcpyAsync(dst, src, n, kind, s));
}

struct worker {
	int rank, ranks, ndev, a, b, layers;
	size_t n;
	char *pool;  /* pinned: (layers + 4) * n */
	char *da;    /* device a: (layers + 2) * n */
	char *db;    /* device b: n */
	cudaStream_t sa;
};

/* The loader thread: its own device, then device a's memory. */
static void *loader(void *arg)
{
	struct worker *w = arg;
	set_device(w->b);
	w->db = dev_alloc(w->n);
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	tp_copy("cudaMemcpyAsync", "copy", w->db, w->pool + (size_t)w->layers * w->n, w->n, cudaMemcpyHostToDevice, s, w->b);
	tp_copy("cudaMemcpyAsync", "copy", w->da + (size_t)w->layers * w->n, w->pool + (size_t)(w->layers + 1) * w->n,
		w->n, cudaMemcpyHostToDevice, s, w->a);
	stream_sync(s, NULL);
	CHECK(cudaStreamDestroy(s));
	return NULL;
}

/* A thread that never chooses a device: device 0, CUDA's implicit one. */
static void *implicit(void *arg)
{
	struct worker *w = arg;
	char *d0 = dev_alloc(w->n);
	tp_copy("cudaMemcpyAsync", "copy", d0, w->pool + (size_t)(w->layers + 2) * w->n, w->n, cudaMemcpyHostToDevice, NULL, 0);
	stream_sync(NULL, NULL);
	dev_free(d0);
	return NULL;
}

static void run_thread(void *(*fn)(void *), struct worker *w)
{
	pthread_t t;
	if (pthread_create(&t, NULL, fn, w) != 0 || pthread_join(t, NULL) != 0) {
		fprintf(stderr, "kvpath: tp-workers: thread failed\n");
		exit(1);
	}
}

static int worker(const struct opts *o, struct result *res, int rank, int ranks)
{
	struct worker w = {.rank = rank, .ranks = ranks, .layers = o->layers, .n = o->layer_bytes};
	CHECK(cudaGetDeviceCount(&w.ndev));
	if (w.ndev < 2 || w.ndev > TP_MAX_DEVICES) {
		fprintf(stderr, "kvpath: tp-workers: %d devices, want 2..%d (LW_REF_GPUS)\n", w.ndev, TP_MAX_DEVICES);
		return 1;
	}
	w.a = rank % w.ndev;
	w.b = (rank + 1) % w.ndev;
	if (rank == 0) {
		for (int d = 0; d < w.ndev; d++) { /* NCCL's first question of every device */
			char id[16] = "";
			struct truth_rec *r = truth_new("cudaDeviceGetPCIBusId", "device_pci_bus_id");
			r->phase = device_phase[d];
			TCALL(r, cudaDeviceGetPCIBusId(id, sizeof id, d));
			if (strcasecmp(id, gpu_of(d)) != 0) {
				fprintf(stderr, "kvpath: tp-workers: device %d is %s, the reference says %s\n", d, id, gpu_of(d));
				return 1;
			}
		}
	}
	set_device(w.a);
	size_t pool_len = (size_t)(w.layers + 4) * w.n;
	w.pool = mmap(NULL, pool_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (w.pool == MAP_FAILED) {
		perror("mmap pool");
		return 1;
	}
	for (size_t i = 0; i < pool_len; i++)
		w.pool[i] = (char)(rank * 31 + i);
	struct truth_rec *r = truth_new("cudaHostRegister", "host_register");
	r->ptr = (uintptr_t)w.pool;
	r->size = pool_len;
	r->has_flags = 1;
	TCALL(r, cudaHostRegister(w.pool, pool_len, cudaHostRegisterDefault));
	truth_note_mem(w.pool, pool_len, MEM_PINNED, 0);
	w.da = dev_alloc((size_t)(w.layers + 2) * w.n);
	CHECK(cudaStreamCreateWithFlags(&w.sa, cudaStreamNonBlocking));

	for (int i = 0; i < w.layers; i++)
		tp_copy("cudaMemcpyAsync", "copy", w.da + (size_t)i * w.n, w.pool + (size_t)i * w.n, w.n,
			cudaMemcpyHostToDevice, w.sa, w.a);
	tp_copy("cudaMemcpyAsync", "copy", w.pool + (size_t)(w.layers + 3) * w.n, w.da, w.n, cudaMemcpyDeviceToHost, w.sa, w.a);
	stream_sync(w.sa, NULL);
	int bad = memcmp(w.pool + (size_t)(w.layers + 3) * w.n, w.pool, w.n) != 0;

	run_thread(loader, &w);
	bad |= memcmp(w.da + (size_t)w.layers * w.n, w.pool + (size_t)(w.layers + 1) * w.n, w.n) != 0;
	if (rank == 1) {
		r = truth_copy("cudaMemcpyPeerAsync", "copy_peer", w.da + (size_t)(w.layers + 1) * w.n, w.db, w.n,
			       cudaMemcpyDeviceToDevice, w.sa, -1);
		r->gpu = gpu_of(w.a); /* the destination's */
		TCALL(r, cudaMemcpyPeerAsync(w.da + (size_t)(w.layers + 1) * w.n, w.a, w.db, w.b, w.n, w.sa));
		stream_sync(w.sa, NULL);
		bad |= memcmp(w.da + (size_t)(w.layers + 1) * w.n, w.db, w.n) != 0;
	}
	if (rank == ranks - 1)
		run_thread(implicit, &w);
	if (bad)
		fprintf(stderr, "kvpath: tp-workers rank %d: data mismatch\n", rank);
	if (getenv("LW_REF_TP_HOLD")) { /* the parent relays this, then releases us */
		size_t copies = 0;
		for (size_t i = 0; i < truth_count(); i++)
			copies += !strcmp(truth_at(i)->op, "copy") || !strcmp(truth_at(i)->op, "copy_peer");
		printf("copied %d %zu\n", (int)getpid(), copies);
		fflush(stdout);
		char line[64];
		(void)!fgets(line, sizeof line, stdin);
	}

	CHECK(cudaStreamDestroy(w.sa));
	dev_free(w.db);
	dev_free(w.da);
	host_unregister(w.pool);
	munmap(w.pool, pool_len);
	snprintf(res->extra, sizeof res->extra, "\"rank\":%d,\"ranks\":%d,\"devices\":%d,\"device\":%d,\"loader_device\":%d",
		 rank, ranks, w.ndev, w.a, w.b);
	return bad;
}

/* The truth file of worker rank: path with "-rank<r>" before ".jsonl". */
static void rank_truth(char *out, size_t len, const char *path, int rank)
{
	size_t n = strlen(path);
	if (n > 6 && !strcmp(path + n - 6, ".jsonl"))
		snprintf(out, len, "%.*s-rank%d.jsonl", (int)(n - 6), path, rank);
	else
		snprintf(out, len, "%s-rank%d", path, rank);
}

int sc_tp_workers(const struct opts *o, struct result *res)
{
	const char *rank_env = getenv("LW_REF_TP_RANK");
	int ranks = 3;
	if (rank_env) {
		int rank = atoi(rank_env), n = atoi(getenv("LW_REF_TP_RANKS") ? getenv("LW_REF_TP_RANKS") : "0");
		return worker(o, res, rank, n > 0 ? n : ranks);
	}
	char names[TP_MAX_DEVICES * 32] = "";
	int own = !getenv("LW_REF_GPUS");
	if (own) {
		snprintf(names, sizeof names, "tpw-%d-0,tpw-%d-1,tpw-%d-2", (int)getpid(), (int)getpid(), (int)getpid());
		setenv("LW_REF_GPUS", names, 1);
	}
	int ndev = 1;
	for (const char *p = getenv("LW_REF_GPUS"); *p; p++)
		ndev += *p == ',';
	if (ndev < ranks)
		ranks = ndev < 2 ? 2 : ndev;
	if (o->hold)
		setenv("LW_REF_TP_HOLD", "1", 1);

	char rank_s[16], ranks_s[16], layers_s[32], bytes_s[32], path[4096];
	pid_t pids[TP_MAX_DEVICES];
	int to[TP_MAX_DEVICES][2], from[TP_MAX_DEVICES][2]; /* with --hold: each worker's stdin and stdout */
	snprintf(ranks_s, sizeof ranks_s, "%d", ranks);
	snprintf(layers_s, sizeof layers_s, "%d", o->layers);
	snprintf(bytes_s, sizeof bytes_s, "%zu", o->layer_bytes);
	for (int r = 0; r < ranks; r++) {
		rank_truth(path, sizeof path, o->truth, r);
		snprintf(rank_s, sizeof rank_s, "%d", r);
		if (o->hold && (pipe(to[r]) != 0 || pipe(from[r]) != 0)) {
			perror("pipe");
			return 1;
		}
		pids[r] = fork();
		if (pids[r] < 0) {
			perror("fork");
			return 1;
		}
		if (pids[r] == 0) {
			if (o->hold && (dup2(to[r][0], 0) < 0 || dup2(from[r][1], 1) < 0))
				_exit(127);
			setenv("LW_REF_TP_RANK", rank_s, 1);
			setenv("LW_REF_TP_RANKS", ranks_s, 1);
			execl("/proc/self/exe", "kvpath", "--scenario", "tp-workers", "--truth", path, "--layers", layers_s,
			      "--layer-bytes", bytes_s, (char *)NULL);
			perror("exec kvpath");
			_exit(127);
		}
	}
	int bad = 0;
	if (o->hold) {
		for (int r = 0; r < ranks; r++) {
			close(to[r][0]);
			close(from[r][1]);
			char line[64] = "";
			FILE *f = fdopen(from[r][0], "r");
			if (!f || !fgets(line, sizeof line, f) || strncmp(line, "copied ", 7)) {
				printf("failed rank %d\n", r);
				bad = 1;
			} else {
				fputs(line, stdout);
			}
			if (f)
				fclose(f);
		}
		printf("held\n");
		fflush(stdout);
		char line[64];
		(void)!fgets(line, sizeof line, stdin);
		for (int r = 0; r < ranks; r++) {
			(void)!write(to[r][1], "go\n", 3);
			close(to[r][1]);
		}
	}
	for (int r = 0; r < ranks; r++) {
		int st = 0;
		if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "kvpath: tp-workers: rank %d (pid %d) failed (status %#x)\n", r, (int)pids[r], st);
			bad = 1;
		}
	}
	if (own)
		for (int d = 0; d < ndev; d++) {
			char shm[64];
			snprintf(shm, sizeof shm, "/lw-ref-tpw-%d-%d", (int)getpid(), d);
			shm_unlink(shm);
		}
	snprintf(res->extra, sizeof res->extra, "\"ranks\":%d,\"devices\":%d", ranks, ndev);
	return bad;
}
