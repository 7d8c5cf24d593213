/*
 * Ground truth of the reference scenarios: one record per CUDA call, written as
 * JSONL at the end of the scenario (engine times are only known after syncs).
 */
#ifndef REFPATH_TRUTH_H
#define REFPATH_TRUTH_H

#include "refcuda.h"
#include <stdint.h>
#include <stdio.h>

struct truth_rec {
	uint64_t seq;
	const char *api, *op;
	int tid, ret;
	/* copies */
	uint64_t dst, src, bytes;
	int kind; /* cudaMemcpyKind; the driver's implied kind for cuMemcpy* */
	const char *direction, *host_mem, *expect_host_mem;
	uint64_t stream;
	int layer, batch_index;
	int is2d;
	uint64_t dpitch, spitch, width, height;
	struct refcudaCopyTimes own;  /* storage for a single copy's times */
	struct refcudaCopyTimes *eng; /* where the copy engine writes them (NULL: not armed) */
	/* memory ops */
	uint64_t ptr, size, flags;
	/* ordering ops */
	uint64_t event;
	int has_stream, has_event, has_flags;
	const char *phase; /* optional: e.g. "alone" / "concurrent" */
	uint64_t t_call_ns, t_return_ns;
};

uint64_t truth_now_ns(void);

/* Scenario-side memory truth: what the scenario itself allocated or registered. */
enum mem_class { MEM_PINNED, MEM_DEVICE };
void truth_note_mem(const void *p, size_t len, enum mem_class c, int before_attach);
void truth_forget_mem(const void *p);
int truth_is_device(const void *p);

/* How the records reach the driver: refcudaSetCopyRecords, or NULL (no engine times). */
typedef void (*truth_set_records_fn)(struct refcudaCopyTimes *recs, size_t n);
void truth_init(const char *scenario, truth_set_records_fn set_records);

/* A new zeroed record (stable address: the engine writes into it later). */
struct truth_rec *truth_new(const char *api, const char *op);

/*
 * A copy record: direction and host memory from the scenario's own knowledge,
 * and the copy-engine time slot armed for the calling thread's next copy
 * (ntimes consecutive records for a batch).
 */
struct truth_rec *truth_copy(const char *api, const char *op, const void *dst, const void *src, uint64_t bytes,
			     int kind, void *stream, int layer);
/* The same without arming: for a batch, fill each entry, then arm them together. */
struct truth_rec *truth_copy_unarmed(const char *api, const char *op, const void *dst, const void *src,
				     uint64_t bytes, int kind, void *stream, int layer);
void truth_arm_times(struct truth_rec **recs, size_t n);

/* Writes all records and the end line; extra is raw JSON members for the end line ("" for none). */
int truth_write(const char *path, const char *extra);
size_t truth_count(void);
struct truth_rec *truth_at(size_t i);

/* Runs expr around t_call/t_return; exits with a message if it fails. */
#define TCALL(rec, expr)                                                                                   \
	do {                                                                                               \
		struct truth_rec *r_ = (rec);                                                              \
		r_->t_call_ns = truth_now_ns();                                                            \
		r_->ret = (int)(expr);                                                                     \
		r_->t_return_ns = truth_now_ns();                                                          \
		if (r_->ret != 0) {                                                                        \
			fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, r_->api, r_->ret); \
			exit(1);                                                                           \
		}                                                                                          \
	} while (0)

/* For calls that are not part of the truth (stream/event create and destroy). */
#define CHECK(expr)                                                                                    \
	do {                                                                                           \
		int rc_ = (int)(expr);                                                                 \
		if (rc_ != 0) {                                                                        \
			fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #expr, rc_);    \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)

#endif
