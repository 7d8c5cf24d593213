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
	int tid, ret; /* ret: the call's return code, written as "result" */
	/* copies */
	uint64_t dst, src, bytes;
	int kind; /* cudaMemcpyKind; the driver's implied kind for cuMemcpy* */
	const char *direction, *host_mem, *expect_host_mem;
	const char *expect_src_mem, *expect_dst_mem; /* what an observer must report of each side */
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
	const char *gpu;   /* copies: the PCI address (sysfs form) of the GPU whose link it crossed, NULL unstated */
	const char *kernel; /* kernel_copy: the launched kernel's (mangled) name */
	uint64_t t_call_ns, t_return_ns;
};

uint64_t truth_now_ns(void);

/*
 * Scenario-side memory truth: what the scenario itself allocated or registered, and
 * host memory it mapped before the observer attached (MEM_PAGEABLE, before_attach 1).
 * Host memory it did not note is pageable memory mapped while observed. An observer
 * cannot know what happened before it attached: memory noted before_attach is expected
 * "unknown" unless it is device memory a call states. Managed memory's pages may be on
 * either side when a copy runs, so a copy placed by its pointers (Default) with a
 * managed side has no direction anyone can state: "unknown".
 */
enum mem_class { MEM_PINNED, MEM_DEVICE, MEM_MANAGED, MEM_PAGEABLE };
void truth_note_mem(const void *p, size_t len, enum mem_class c, int before_attach);
void truth_forget_mem(const void *p);
int truth_is_device(const void *p);
int truth_is_pinned(const void *p); /* noted MEM_PINNED */

/* How the records reach the driver: refcudaSetCopyRecords, or NULL (no engine times). */
typedef void (*truth_set_records_fn)(struct refcudaCopyTimes *recs, size_t n);
void truth_init(const char *scenario, truth_set_records_fn set_records);

/* A new zeroed record (stable address: the engine writes into it later). */
struct truth_rec *truth_new(const char *api, const char *op);

/*
 * A copy record: direction and host memory from the scenario's own knowledge,
 * and the copy-engine time slot armed for the calling thread's next copy
 * (ntimes consecutive records for a batch). The direction is the one requested:
 * the kind's for an explicit kind (1 H2D, 2 D2H, 3 D2D, also when a pointer is
 * bad), else resolved from the scenario's memory table; host_mem/expect_host_mem
 * describe the host side that direction names.
 */
struct truth_rec *truth_copy(const char *api, const char *op, const void *dst, const void *src, uint64_t bytes,
			     int kind, void *stream, int layer);
/* The same without arming: for a batch, fill each entry, then arm them together. */
struct truth_rec *truth_copy_unarmed(const char *api, const char *op, const void *dst, const void *src,
				     uint64_t bytes, int kind, void *stream, int layer);
void truth_arm_times(struct truth_rec **recs, size_t n);
/* Drops whatever is still armed for the calling thread (a call that failed before
 * its copy reached an engine). */
void truth_disarm(void);

/* Writes all records and the end line; extra is raw JSON members for the end line ("" for none). */
int truth_write(const char *path, const char *extra);
size_t truth_count(void);
struct truth_rec *truth_at(size_t i);

/* Runs expr around t_call/t_return and records its return code; exits with a
 * message if it is not `expected` (TCALL: 0). A failed call's record keeps what was
 * requested (bytes, direction, expect_host_mem...) and gets no engine times. */
#define TCALL_EXPECT(rec, expr, expected)                                                                   \
	do {                                                                                                \
		struct truth_rec *r_ = (rec);                                                               \
		int want_ = (int)(expected);                                                                \
		r_->t_call_ns = truth_now_ns();                                                             \
		r_->ret = (int)(expr);                                                                      \
		r_->t_return_ns = truth_now_ns();                                                           \
		if (r_->ret != 0)                                                                           \
			truth_disarm();                                                                     \
		if (r_->ret != want_) {                                                                     \
			fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, r_->api, \
				r_->ret, want_);                                                            \
			exit(1);                                                                            \
		}                                                                                           \
	} while (0)

#define TCALL(rec, expr) TCALL_EXPECT(rec, expr, 0)

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
