/* Recorded CUDA calls shared by the scenario drivers (kvpath, rdmapath):
 * each makes the call and writes its ground-truth line. */
#include "calls.h"
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void host_unregister(void *p)
{
	struct truth_rec *r = truth_new("cudaHostUnregister", "host_unregister");
	r->ptr = (uintptr_t)p;
	TCALL(r, cudaHostUnregister(p));
	truth_forget_mem(p);
}

char *dev_alloc(size_t n)
{
	void *d = NULL;
	struct truth_rec *r = truth_new("cudaMalloc", "device_alloc");
	r->size = n;
	TCALL(r, cudaMalloc(&d, n));
	r->ptr = (uintptr_t)d;
	truth_note_mem(d, n, MEM_DEVICE, 0);
	return d;
}

void dev_free(void *d)
{
	struct truth_rec *r = truth_new("cudaFree", "device_free");
	r->ptr = (uintptr_t)d;
	TCALL(r, cudaFree(d));
	truth_forget_mem(d);
}

void stream_sync(cudaStream_t s, const char *phase)
{
	struct truth_rec *r = truth_new("cudaStreamSynchronize", "stream_sync");
	r->stream = (uintptr_t)s;
	r->has_stream = 1;
	r->phase = phase;
	TCALL(r, cudaStreamSynchronize(s));
}


void *pool_mmap(size_t n, int seed)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap pool");
		exit(1);
	}
	memset(p, seed, n);
	return p;
}

void host_register(void *p, size_t n, int before_attach)
{
	struct truth_rec *r = truth_new("cudaHostRegister", "host_register");
	r->ptr = (uintptr_t)p;
	r->size = n;
	r->has_flags = 1;
	TCALL(r, cudaHostRegister(p, n, cudaHostRegisterDefault));
	truth_note_mem(p, n, MEM_PINNED, before_attach);
}

char *pinned_pool(size_t n, int seed)
{
	char *p = pool_mmap(n, seed);
	host_register(p, n, 0);
	return p;
}

void event_record(cudaEvent_t e, cudaStream_t s, int layer)
{
	struct truth_rec *r = truth_new("cudaEventRecord", "event_record");
	r->event = (uintptr_t)e;
	r->stream = (uintptr_t)s;
	r->has_event = r->has_stream = 1;
	r->layer = layer;
	TCALL(r, cudaEventRecord(e, s));
}

void stream_wait_event(cudaStream_t s, cudaEvent_t e, int layer)
{
	struct truth_rec *r = truth_new("cudaStreamWaitEvent", "stream_wait_event");
	r->event = (uintptr_t)e;
	r->stream = (uintptr_t)s;
	r->has_event = r->has_stream = r->has_flags = 1;
	r->layer = layer;
	TCALL(r, cudaStreamWaitEvent(s, e, 0));
}

/*
 * A shape whose verdict rests on its submitting thread keeping the lane fed
 * (two flows in flight together, one copy after another) must not rest on
 * the CPU scheduler: on a machine whose CPUs are all busy an ordinary thread
 * is left out for milliseconds, the lanes drain, and the shape is not made.
 * So for that phase the thread runs SCHED_FIFO at priority 1 where it has
 * the privilege: above every ordinary thread, below the movers (priority 2,
 * driver/mover.c), which it must never keep off a CPU. It blocks or naps
 * while it waits, never holding a CPU; RT throttling bounds it anyway.
 */
void submit_as_mover(int on)
{
	struct sched_param p = {.sched_priority = on ? 1 : 0};
	(void)pthread_setschedparam(pthread_self(), on ? SCHED_FIFO : SCHED_OTHER, &p);
}
