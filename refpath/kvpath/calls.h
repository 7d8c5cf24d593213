/* Recorded CUDA calls shared by the scenario drivers. */
#ifndef REFPATH_CALLS_H
#define REFPATH_CALLS_H

#include "refcuda.h"
#include "truth.h"

void *pool_mmap(size_t n, int seed);                         /* populated anonymous memory filled with seed */
void host_register(void *p, size_t n, int before_attach);      /* cudaHostRegister, recorded */
char *pinned_pool(size_t n, int seed);                          /* pool_mmap + host_register */
void host_unregister(void *p);
char *dev_alloc(size_t n);
void dev_free(void *d);
void stream_sync(cudaStream_t s, const char *phase);
void event_record(cudaEvent_t e, cudaStream_t s, int layer);      /* cudaEventRecord, with its layer */
void stream_wait_event(cudaStream_t s, cudaEvent_t e, int layer); /* cudaStreamWaitEvent(s, e, 0) */
void submit_as_mover(int on); /* the calling thread at SCHED_FIFO 1 (on) or back to SCHED_OTHER, where allowed */

#endif
