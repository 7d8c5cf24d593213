/*
 * Streams and events. Each stream has a copy-engine thread and a bounded FIFO of
 * operations (copy, event record, wait for an event). Async calls enqueue and
 * return; synchronous ones enqueue on the default stream and wait for their
 * ticket. The enqueue path takes one uncontended mutex and signals the engine
 * only when it sleeps, so a call costs no syscall in the common case.
 */
#include "internal.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_MAGIC 0x53545245u /* "STRE" */
#define EVENT_MAGIC 0x45564e54u  /* "EVNT" */
#define QUEUE_CAP 4096u
#define ENGINE_BATCH 32u

struct CUevent_st {
	uint32_t magic;
	atomic_int refs; /* the handle plus every queued op that names it */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t recorded; /* generation of the latest cuEventRecord */
	uint64_t done;     /* highest generation an engine has reached */
};

struct CUstream_st {
	uint32_t magic;
	pthread_mutex_t mu;
	pthread_cond_t cv_work, cv_space, cv_done;
	struct rc_op *ring;
	unsigned head, count;
	uint64_t submitted, completed;
	int engine_idle, space_waiters, done_waiters;
	pthread_t thread;
	struct CUstream_st *next, *prev; /* all live streams, for cuCtxSynchronize */
	/* Stream capture (under mu): the graph submitted work goes into instead of the
	 * queue, NULL when not capturing; invalid once something capture cannot record
	 * was submitted. */
	struct CUgraph_st *capture;
	int capture_invalid;
};

static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st all_head = {.next = &all_head, .prev = &all_head};
static struct CUstream_st *legacy_stream;
static pthread_key_t ptds_key;
static __thread struct CUstream_st *ptds_stream;

/* ---------------- events ---------------- */

void rc_event_ref(struct CUevent_st *e)
{
	atomic_fetch_add(&e->refs, 1);
}

void rc_event_unref(struct CUevent_st *e)
{
	if (atomic_fetch_sub(&e->refs, 1) == 1) {
		pthread_mutex_destroy(&e->mu);
		pthread_cond_destroy(&e->cv);
		free(e);
	}
}

static struct CUevent_st *event_check(CUevent e)
{
	return (e && e->magic == EVENT_MAGIC) ? e : NULL;
}

/* ---------------- engine ---------------- */

static void op_run(struct rc_op *o, uint64_t *cursor)
{
	switch (o->type) {
	case OP_COPY:
		if (o->x.dir == RC_H2D || o->x.dir == RC_D2H)
			rc_xfer_run(&o->x, cursor);
		else
			rc_xfer_run(&o->x, &(uint64_t){0});
		break;
	case OP_EVENT_RECORD:
		pthread_mutex_lock(&o->ev->mu);
		if (o->gen > o->ev->done)
			o->ev->done = o->gen;
		pthread_cond_broadcast(&o->ev->cv);
		pthread_mutex_unlock(&o->ev->mu);
		rc_event_unref(o->ev);
		break;
	case OP_WAIT_EVENT:
		pthread_mutex_lock(&o->ev->mu);
		while (o->ev->done < o->gen) {
			pthread_cond_wait(&o->ev->cv, &o->ev->mu);
			*cursor = 0; /* the engine stalled: the next copy starts afresh */
		}
		pthread_mutex_unlock(&o->ev->mu);
		rc_event_unref(o->ev);
		break;
	case OP_FN:
		o->fn(o->arg);
		break;
	case OP_KERNEL:
		/* the kernel's SMs load and store in this engine's lane cursor */
		o->k->l.cursor = cursor;
		if (o->k->times)
			o->k->times->start_ns = rc_now_ns();
		o->k->fn(&o->k->l, o->k->params);
		if (o->k->times)
			o->k->times->end_ns = rc_now_ns();
		free(o->k);
		break;
	}
}

static void *engine_main(void *arg)
{
	struct CUstream_st *s = arg;
	rc_mover_thread(); /* a copy engine: the scheduler must not idle the lane (mover.c) */
	struct rc_op batch[ENGINE_BATCH];
	uint64_t cursor = 0; /* see lane.c: back-to-back copies leave no gap */
	int stop = 0;
	while (!stop) {
		pthread_mutex_lock(&s->mu);
		while (s->count == 0) {
			cursor = 0; /* idle: the next copy starts when it is submitted */
			s->engine_idle = 1;
			pthread_cond_wait(&s->cv_work, &s->mu);
			s->engine_idle = 0;
		}
		unsigned n = s->count < ENGINE_BATCH ? s->count : ENGINE_BATCH;
		for (unsigned i = 0; i < n; i++)
			batch[i] = s->ring[(s->head + i) % QUEUE_CAP];
		s->head = (s->head + n) % QUEUE_CAP;
		s->count -= n;
		if (s->space_waiters)
			pthread_cond_broadcast(&s->cv_space);
		pthread_mutex_unlock(&s->mu);

		/* Complete ops one by one so a sync waits only for its own ticket. */
		for (unsigned i = 0; i < n; i++) {
			if (batch[i].type == OP_STOP)
				stop = 1;
			else
				op_run(&batch[i], &cursor);
			pthread_mutex_lock(&s->mu);
			s->completed++;
			if (s->done_waiters)
				pthread_cond_broadcast(&s->cv_done);
			pthread_mutex_unlock(&s->mu);
		}
	}
	return NULL;
}

/* Bounded: blocks while the queue is full. Returns the op's ticket. */
static uint64_t stream_enqueue(struct CUstream_st *s, const struct rc_op *o)
{
	pthread_mutex_lock(&s->mu);
	while (s->count == QUEUE_CAP) {
		s->space_waiters++;
		pthread_cond_wait(&s->cv_space, &s->mu);
		s->space_waiters--;
	}
	s->ring[(s->head + s->count) % QUEUE_CAP] = *o;
	s->count++;
	uint64_t ticket = ++s->submitted;
	if (s->engine_idle)
		pthread_cond_signal(&s->cv_work);
	pthread_mutex_unlock(&s->mu);
	return ticket;
}

/* ticket 0 means "everything submitted so far". */
static void stream_wait(struct CUstream_st *s, uint64_t ticket)
{
	pthread_mutex_lock(&s->mu);
	if (!ticket)
		ticket = s->submitted;
	while (s->completed < ticket) {
		s->done_waiters++;
		pthread_cond_wait(&s->cv_done, &s->mu);
		s->done_waiters--;
	}
	pthread_mutex_unlock(&s->mu);
}

static struct CUstream_st *stream_new(void)
{
	struct CUstream_st *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->ring = malloc(QUEUE_CAP * sizeof *s->ring);
	if (!s->ring) {
		free(s);
		return NULL;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv_work, NULL);
	pthread_cond_init(&s->cv_space, NULL);
	pthread_cond_init(&s->cv_done, NULL);
	s->magic = STREAM_MAGIC;
	if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
		free(s->ring);
		free(s);
		return NULL;
	}
	pthread_setname_np(s->thread, "refcuda-engine");
	pthread_mutex_lock(&all_mu);
	s->next = &all_head;
	s->prev = all_head.prev;
	all_head.prev->next = s;
	all_head.prev = s;
	pthread_mutex_unlock(&all_mu);
	return s;
}

/* Drains the stream, stops its engine and frees it. */
static void stream_free(struct CUstream_st *s)
{
	pthread_mutex_lock(&all_mu);
	s->prev->next = s->next;
	s->next->prev = s->prev;
	pthread_mutex_unlock(&all_mu);
	struct rc_op stop = {.type = OP_STOP};
	stream_enqueue(s, &stop);
	pthread_join(s->thread, NULL);
	if (s->capture)
		rc_graph_free(s->capture);
	s->magic = 0;
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv_work);
	pthread_cond_destroy(&s->cv_space);
	pthread_cond_destroy(&s->cv_done);
	free(s->ring);
	free(s);
}

static void ptds_destroy(void *p)
{
	stream_free(p);
}

void rc_streams_init(void)
{
	pthread_key_create(&ptds_key, ptds_destroy);
	legacy_stream = stream_new();
}

/* Maps a stream argument to a stream: 0 is the legacy default stream, or the
 * calling thread's own default stream for the per-thread (_ptds/_ptsz) forms. */
struct CUstream_st *rc_stream_resolve(CUstream s, int per_thread)
{
	rc_init();
	if (s == CU_STREAM_PER_THREAD || (!s && per_thread)) {
		if (!ptds_stream) {
			ptds_stream = stream_new();
			if (ptds_stream)
				pthread_setspecific(ptds_key, ptds_stream);
		}
		return ptds_stream;
	}
	if (!s || s == CU_STREAM_LEGACY)
		return legacy_stream;
	return s->magic == STREAM_MAGIC ? s : NULL;
}

/* ---------------- copy submission ---------------- */

static __thread struct refcudaCopyTimes *times_next;
static __thread size_t times_left;

RC_API void refcudaSetCopyRecords(struct refcudaCopyTimes *recs, size_t n)
{
	times_next = recs;
	times_left = recs ? n : 0;
	for (size_t i = 0; i < times_left; i++)
		recs[i] = (struct refcudaCopyTimes){0, 0};
}

void rc_copy_records_skip(size_t n)
{
	if (n > times_left)
		n = times_left;
	times_next += n;
	times_left -= n;
}

/*
 * Work submitted to s: recorded into its capture while it captures (not run: the
 * graph runs it at each launch), else queued with a ticket (*ticket, when asked).
 * An event record takes the event's next generation only when queued; a captured
 * kernel or copy writes no ground-truth times.
 */
static CUresult stream_submit(struct CUstream_st *s, const struct rc_op *in, uint64_t *ticket)
{
	struct rc_op o = *in;
	pthread_mutex_lock(&s->mu);
	if (s->capture) {
		CUresult r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
		if (o.type == OP_COPY || o.type == OP_KERNEL || o.type == OP_EVENT_RECORD) {
			if (o.type == OP_COPY)
				o.x.times = NULL;
			if (o.type == OP_KERNEL)
				o.k->times = NULL;
			if (o.type == OP_EVENT_RECORD)
				rc_event_ref(o.ev);
			r = rc_graph_add(s->capture, &o);
			if (r != CUDA_SUCCESS && o.type == OP_EVENT_RECORD)
				rc_event_unref(o.ev);
		}
		if (r != CUDA_SUCCESS)
			s->capture_invalid = 1;
		pthread_mutex_unlock(&s->mu);
		return r;
	}
	pthread_mutex_unlock(&s->mu);
	switch (o.type) {
	case OP_COPY:
		o.x.ready_ns = rc_now_ns() + RC_COPY_TURNAROUND_NS;
		break;
	case OP_EVENT_RECORD:
		pthread_mutex_lock(&o.ev->mu);
		o.gen = ++o.ev->recorded;
		pthread_mutex_unlock(&o.ev->mu);
		rc_event_ref(o.ev);
		break;
	case OP_WAIT_EVENT:
		rc_event_ref(o.ev);
		break;
	}
	uint64_t t = stream_enqueue(s, &o);
	if (ticket)
		*ticket = t;
	return CUDA_SUCCESS;
}

CUresult rc_stream_submit(CUstream stream, int per_thread, const struct rc_op *o)
{
	struct CUstream_st *s = rc_stream_resolve(stream, per_thread);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	return stream_submit(s, o, NULL);
}

/* A call that must wait on s (a host wait, a synchronous copy) while s captures:
 * refused, and the capture is invalidated. */
static int capture_refuses(struct CUstream_st *s)
{
	pthread_mutex_lock(&s->mu);
	int capturing = s->capture != NULL;
	if (capturing)
		s->capture_invalid = 1;
	pthread_mutex_unlock(&s->mu);
	return capturing;
}

int rc_submit_copy(struct rc_xfer *x, CUstream stream, unsigned int flags)
{
	x->times = NULL;
	if (times_left) {
		x->times = times_next++;
		times_left--;
	}
	struct CUstream_st *s = rc_stream_resolve(stream, (flags & REFCUDA_PER_THREAD) != 0);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!x->width || !x->height)
		return CUDA_SUCCESS;
	if (!(flags & REFCUDA_ASYNC) && capture_refuses(s))
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	struct rc_op o = {.type = OP_COPY, .x = *x};
	if (x->staged) {
		pthread_mutex_lock(&s->mu);
		int capturing = s->capture != NULL;
		pthread_mutex_unlock(&s->mu);
		if (capturing) /* a graph node: the engine stages it at each launch */
			return stream_submit(s, &o, NULL);
		/* Pageable: after the stream's earlier work, the calling thread stages the
		 * bytes through the lane itself, so even the Async forms block for a time
		 * that grows with the size. */
		stream_wait(s, 0);
		rc_xfer_run(x, &(uint64_t){0});
		return CUDA_SUCCESS;
	}
	uint64_t t = 0;
	CUresult r = stream_submit(s, &o, &t);
	if (r == CUDA_SUCCESS && !(flags & REFCUDA_ASYNC))
		stream_wait(s, t);
	return r;
}

CUresult rc_submit_kernel(struct rc_launch *k, CUstream stream, int per_thread)
{
	k->times = NULL;
	if (times_left) {
		k->times = times_next++;
		times_left--;
	}
	struct CUstream_st *s = rc_stream_resolve(stream, per_thread);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	struct rc_op o = {.type = OP_KERNEL, .k = k};
	return stream_submit(s, &o, NULL);
}

CUresult rc_stream_enqueue_fn(CUstream stream, int per_thread, void (*fn)(uintptr_t), uintptr_t arg)
{
	struct rc_op o = {.type = OP_FN, .fn = fn, .arg = arg};
	return rc_stream_submit(stream, per_thread, &o);
}

/* ---------------- exported stream and event API ---------------- */

RC_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	RC_GATE();
	(void)Flags;
	rc_init();
	if (!phStream)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *s = stream_new();
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*phStream = s;
	return CUDA_SUCCESS;
}

RC_API CUresult cuStreamDestroy_v2(CUstream hStream)
{
	RC_GATE();
	rc_init();
	if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD ||
	    hStream->magic != STREAM_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	stream_free(hStream);
	return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, int per_thread)
{
	struct CUstream_st *s = rc_stream_resolve(h, per_thread);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (capture_refuses(s))
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	stream_wait(s, 0);
	return CUDA_SUCCESS;
}

RC_API CUresult cuStreamSynchronize(CUstream hStream)
{
	RC_GATE();
	return stream_sync(hStream, 0);
}

RC_API CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	RC_GATE();
	return stream_sync(hStream, 1);
}

RC_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	RC_GATE();
	(void)Flags;
	rc_init();
	if (!phEvent)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUevent_st *e = calloc(1, sizeof *e);
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = EVENT_MAGIC;
	atomic_init(&e->refs, 1);
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	*phEvent = e;
	return CUDA_SUCCESS;
}

/* Like the real driver, destroying an event with queued work is legal: the
 * memory goes when the last queued op that names it has run. */
RC_API CUresult cuEventDestroy_v2(CUevent hEvent)
{
	RC_GATE();
	struct CUevent_st *e = event_check(hEvent);
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	e->magic = 0;
	rc_event_unref(e);
	return CUDA_SUCCESS;
}

static CUresult event_record(CUevent hEvent, CUstream hStream, int per_thread)
{
	struct CUevent_st *e = event_check(hEvent);
	struct CUstream_st *s = rc_stream_resolve(hStream, per_thread);
	if (!e || !s)
		return CUDA_ERROR_INVALID_HANDLE;
	struct rc_op o = {.type = OP_EVENT_RECORD, .ev = e}; /* the generation: stream_submit */
	return stream_submit(s, &o, NULL);
}

RC_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	RC_GATE();
	return event_record(hEvent, hStream, 0);
}

RC_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	RC_GATE();
	return event_record(hEvent, hStream, 1);
}

/* flags: CU_EVENT_RECORD_DEFAULT or CU_EVENT_RECORD_EXTERNAL (graphs only: no effect here) */
RC_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	RC_GATE();
	if (flags & ~CU_EVENT_RECORD_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	return event_record(hEvent, hStream, 0);
}

RC_API CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	RC_GATE();
	if (flags & ~CU_EVENT_RECORD_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	return event_record(hEvent, hStream, 1);
}

RC_API CUresult cuEventSynchronize(CUevent hEvent)
{
	RC_GATE();
	struct CUevent_st *e = event_check(hEvent);
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&e->mu);
	uint64_t want = e->recorded;
	while (e->done < want)
		pthread_cond_wait(&e->cv, &e->mu);
	pthread_mutex_unlock(&e->mu);
	return CUDA_SUCCESS;
}

/* CUDA_SUCCESS once an engine reached the latest record, CUDA_ERROR_NOT_READY before:
 * the answer of a poll, not a failure. */
RC_API CUresult cuEventQuery(CUevent hEvent)
{
	RC_GATE();
	struct CUevent_st *e = event_check(hEvent);
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&e->mu);
	int done = e->done >= e->recorded;
	pthread_mutex_unlock(&e->mu);
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult stream_wait_event(CUstream hStream, CUevent hEvent, int per_thread)
{
	struct CUevent_st *e = event_check(hEvent);
	struct CUstream_st *s = rc_stream_resolve(hStream, per_thread);
	if (!e || !s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&e->mu);
	uint64_t gen = e->recorded; /* waits for the latest record at call time */
	pthread_mutex_unlock(&e->mu);
	struct rc_op o = {.type = OP_WAIT_EVENT, .ev = e, .gen = gen};
	return stream_submit(s, &o, NULL);
}

RC_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	RC_GATE();
	(void)Flags;
	return stream_wait_event(hStream, hEvent, 0);
}

RC_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	RC_GATE();
	(void)Flags;
	return stream_wait_event(hStream, hEvent, 1);
}

/* Waits for every stream of the process: each for what was submitted to it when
 * it is reached. all_mu keeps the streams alive meanwhile; engines never take it. */
RC_API CUresult cuCtxSynchronize(void)
{
	RC_GATE();
	rc_init();
	pthread_mutex_lock(&all_mu);
	for (struct CUstream_st *s = all_head.next; s != &all_head; s = s->next)
		stream_wait(s, 0);
	pthread_mutex_unlock(&all_mu);
	return CUDA_SUCCESS;
}

/* ---------------- stream capture ---------------- */

static CUresult begin_capture(CUstream h, int per_thread, CUstreamCaptureMode mode)
{
	if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *s = rc_stream_resolve(h, per_thread);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (s == legacy_stream)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	struct CUgraph_st *g = rc_graph_new();
	if (!g)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&s->mu);
	int busy = s->capture != NULL;
	if (!busy) {
		s->capture = g;
		s->capture_invalid = 0;
	}
	pthread_mutex_unlock(&s->mu);
	if (busy) {
		rc_graph_free(g);
		return CUDA_ERROR_ILLEGAL_STATE;
	}
	return CUDA_SUCCESS;
}

/* CUDA 10.0's form: no mode argument (modes are not enforced here). */
RC_API CUresult cuStreamBeginCapture(CUstream hStream)
{
	RC_GATE();
	return begin_capture(hStream, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

RC_API CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
	RC_GATE();
	return begin_capture(hStream, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

RC_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	RC_GATE();
	return begin_capture(hStream, 0, mode);
}

RC_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	RC_GATE();
	return begin_capture(hStream, 1, mode);
}

/* Ends the capture: its graph, or CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (no graph)
 * when something capture cannot record was submitted meanwhile. */
static CUresult end_capture(CUstream h, int per_thread, CUgraph *phGraph)
{
	if (!phGraph)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *s = rc_stream_resolve(h, per_thread);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	struct CUgraph_st *g = s->capture;
	int invalid = s->capture_invalid;
	s->capture = NULL;
	s->capture_invalid = 0;
	pthread_mutex_unlock(&s->mu);
	if (!g)
		return CUDA_ERROR_ILLEGAL_STATE;
	if (invalid) {
		rc_graph_free(g);
		*phGraph = NULL;
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	}
	*phGraph = g;
	return CUDA_SUCCESS;
}

RC_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	RC_GATE();
	return end_capture(hStream, 0, phGraph);
}

RC_API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	RC_GATE();
	return end_capture(hStream, 1, phGraph);
}

static CUresult is_capturing(CUstream h, int per_thread, CUstreamCaptureStatus *status)
{
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *s = rc_stream_resolve(h, per_thread);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	*status = !s->capture ? CU_STREAM_CAPTURE_STATUS_NONE
		  : s->capture_invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
				       : CU_STREAM_CAPTURE_STATUS_ACTIVE;
	pthread_mutex_unlock(&s->mu);
	return CUDA_SUCCESS;
}

RC_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	RC_GATE();
	return is_capturing(hStream, 0, captureStatus);
}

RC_API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	RC_GATE();
	return is_capturing(hStream, 1, captureStatus);
}

/* A stream-ordered memset of device memory (the engine writes the bytes). */
struct memset_op {
	void *dst;
	unsigned char value;
	size_t n;
};

static void memset_run(uintptr_t arg)
{
	struct memset_op *m = (struct memset_op *)arg;
	memset(m->dst, m->value, m->n);
	free(m);
}

RC_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	RC_GATE();
	rc_init();
	if (!rc_is_device((const void *)(uintptr_t)dstDevice, N))
		return CUDA_ERROR_INVALID_VALUE;
	struct memset_op *m = malloc(sizeof *m);
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*m = (struct memset_op){.dst = (void *)(uintptr_t)dstDevice, .value = uc, .n = N};
	CUresult r = rc_stream_enqueue_fn(hStream, 0, memset_run, (uintptr_t)m);
	if (r != CUDA_SUCCESS)
		free(m);
	return r;
}
