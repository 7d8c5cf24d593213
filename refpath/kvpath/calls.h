/* Recorded CUDA calls shared by the scenario drivers. */
#ifndef REFPATH_CALLS_H
#define REFPATH_CALLS_H

#include "refcuda.h"
#include "truth.h"

void host_unregister(void *p);
char *dev_alloc(size_t n);
void dev_free(void *d);
void stream_sync(cudaStream_t s, const char *phase);

#endif
