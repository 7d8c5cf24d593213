/* kvpath: the scenario driver of the reference KV data path. */
#ifndef REFPATH_KVPATH_H
#define REFPATH_KVPATH_H

#include "refcuda.h"
#include "truth.h"
#include <stddef.h>
#include <stdint.h>

struct opts {
	const char *scenario;
	const char *truth; /* may be NULL for callbench */
	int hold;
	int layers;         /* 0: scenario default */
	size_t layer_bytes; /* 0: scenario default */
	long iterations;    /* 0: scenario default */
	const char *script; /* replay: the call stream to make (replay.c) */
};

/* Result of a scenario: raw JSON members appended to the end line ("" for none). */
struct result {
	char extra[1024];
};

typedef int (*scenario_fn)(const struct opts *o, struct result *res);

struct scenario {
	const char *name;
	scenario_fn run;
	int layers;         /* defaults */
	size_t layer_bytes;
	int needs_truth;
};

extern const struct scenario scenarios[];

/* Scenarios in files of their own (rows in scenarios.c's table). */
int sc_link_trains_up(const struct opts *o, struct result *res); /* linktrain.c */
int sc_tp_workers(const struct opts *o, struct result *res);     /* tpworkers.c */
int sc_late_pool_pages(const struct opts *o, struct result *res); /* late_pool_pages.c */
int sc_vmm_pool_managed(const struct opts *o, struct result *res); /* vmm_pool_managed.c */
int sc_launchbench(const struct opts *o, struct result *res);     /* launchbench.c */
int sc_replay(const struct opts *o, struct result *res);          /* replay.c: a trace's calls */
int sc_storage_load(const struct opts *o, struct result *res);    /* storage_load.c */
int sc_storage_writeback(const struct opts *o, struct result *res); /* storage_writeback.c */
struct stat;
int kv_file_open(const struct opts *o, const char *stem, char *path, size_t pathn, int *direct,
		 struct stat *st); /* storage_load.c: a KV file under LW_REF_STORAGE_DIR, opened O_DIRECT if it can be */

/* overlap.c: the shapes of same-direction overlap */
int sc_no_overlap(const struct opts *o, struct result *res);
int sc_big_and_trickle(const struct opts *o, struct result *res);
int sc_two_proc_lane(const struct opts *o, struct result *res);

/* inflight.c: one page in flight at a time, or a layer's pages queued */
int sc_inflight_serial(const struct opts *o, struct result *res);
int sc_inflight_queued(const struct opts *o, struct result *res);
/* computeoverlap.c: the shapes of compute overlap */
int sc_layer_compute(const struct opts *o, struct result *res);
int sc_layer_compute_sync(const struct opts *o, struct result *res);
int sc_layer_compute_item(const struct opts *o, struct result *res);
/* graphs.c: a decode loop under CUDA graphs */
int sc_decode_graphs(const struct opts *o, struct result *res);
void compute_launch(void *out, cudaStream_t s, int layer, int64_t ns); /* the compute stand-in, ns on s */
extern const void *const compute_kernel_stub; /* its host stub: (void *out, long ns), busy ns on its stream */
extern const char compute_kernel_name[];      /* its mangled name */
/* decode.c: healthy decode loops, designed to raise nothing */
int sc_decode_loop(const struct opts *o, struct result *res);
int sc_decode_loop_loads(const struct opts *o, struct result *res);
int sc_decode_item(const struct opts *o, struct result *res);

/* main.c: the --hold point between setup and copies */
void hold_point(const struct opts *o);

#endif
