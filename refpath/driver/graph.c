/*
 * Graphs: what a stream capture recorded (stream.c), instantiated and launched.
 * A graph is its nodes in capture order, each an op as a stream's engine runs it;
 * an executable graph is a copy of them. cuGraphLaunch submits a fresh copy of every
 * node to the launch stream, in order: the copies, kernels and event records run
 * there as if each had been submitted at the launch (one stream per capture, so the
 * graph's dependencies are its order). Nothing here writes ground-truth times.
 */
#include "internal.h"
#include <stdlib.h>
#include <string.h>

#define GRAPH_MAGIC 0x47525048u /* "GRPH" */
#define EXEC_MAGIC 0x47455843u  /* "GEXC" */

struct nodes {
	struct rc_op *op;
	size_t n, cap;
};

struct CUgraph_st {
	uint32_t magic;
	struct nodes nodes;
};

struct CUgraphExec_st {
	uint32_t magic;
	struct nodes nodes;
};

/* A kernel launch as its own allocation, its parameter pointers moved into it. */
static struct rc_launch *launch_dup(const struct rc_launch *k)
{
	struct rc_launch *d = malloc(k->size);
	if (!d)
		return NULL;
	memcpy(d, k, k->size);
	for (unsigned i = 0; i < REFCUDA_MAX_PARAMS; i++)
		if (k->params[i])
			d->params[i] = d->data + ((const unsigned char *)k->params[i] - k->data);
	d->times = NULL;
	return d;
}

/* o as an op of its own: its kernel copied, its event referenced once more. */
static CUresult op_dup(const struct rc_op *o, struct rc_op *d)
{
	*d = *o;
	if (o->type == OP_KERNEL && !(d->k = launch_dup(o->k)))
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (o->type == OP_EVENT_RECORD)
		rc_event_ref(o->ev);
	return CUDA_SUCCESS;
}

static void op_release(struct rc_op *o)
{
	if (o->type == OP_KERNEL)
		free(o->k);
	if (o->type == OP_EVENT_RECORD)
		rc_event_unref(o->ev);
}

static CUresult nodes_add(struct nodes *ns, const struct rc_op *o)
{
	if (ns->n == ns->cap) {
		size_t cap = ns->cap ? 2 * ns->cap : 16;
		struct rc_op *p = realloc(ns->op, cap * sizeof *p);
		if (!p)
			return CUDA_ERROR_OUT_OF_MEMORY;
		ns->op = p;
		ns->cap = cap;
	}
	ns->op[ns->n++] = *o;
	return CUDA_SUCCESS;
}

static void nodes_free(struct nodes *ns)
{
	for (size_t i = 0; i < ns->n; i++)
		op_release(&ns->op[i]);
	free(ns->op);
	*ns = (struct nodes){0};
}

struct CUgraph_st *rc_graph_new(void)
{
	struct CUgraph_st *g = calloc(1, sizeof *g);
	if (g)
		g->magic = GRAPH_MAGIC;
	return g;
}

CUresult rc_graph_add(struct CUgraph_st *g, const struct rc_op *o)
{
	return nodes_add(&g->nodes, o);
}

void rc_graph_free(struct CUgraph_st *g)
{
	nodes_free(&g->nodes);
	g->magic = 0;
	free(g);
}

static struct CUgraph_st *graph_check(CUgraph g)
{
	return g && g->magic == GRAPH_MAGIC ? g : NULL;
}

static struct CUgraphExec_st *exec_check(CUgraphExec x)
{
	return x && x->magic == EXEC_MAGIC ? x : NULL;
}

static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph)
{
	struct CUgraph_st *g = graph_check(hGraph);
	if (!phGraphExec || !g)
		return !phGraphExec ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
	struct CUgraphExec_st *x = calloc(1, sizeof *x);
	if (!x)
		return CUDA_ERROR_OUT_OF_MEMORY;
	x->magic = EXEC_MAGIC;
	for (size_t i = 0; i < g->nodes.n; i++) {
		struct rc_op d;
		CUresult r = op_dup(&g->nodes.op[i], &d);
		if (r == CUDA_SUCCESS && (r = nodes_add(&x->nodes, &d)) != CUDA_SUCCESS)
			op_release(&d);
		if (r != CUDA_SUCCESS) {
			nodes_free(&x->nodes);
			free(x);
			return r;
		}
	}
	*phGraphExec = x;
	return CUDA_SUCCESS;
}

/* flags: CUDA_GRAPH_INSTANTIATE_FLAG_* (accepted: they change nothing here). */
RC_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	RC_GATE();
	(void)flags;
	return instantiate(phGraphExec, hGraph);
}

/* The 11.x forms NVIDIA's drivers still export: no node fails here, so *phErrorNode
 * is NULL and the log empty. */
static CUresult instantiate_logged(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
				   size_t bufferSize)
{
	if (phErrorNode)
		*phErrorNode = NULL;
	if (logBuffer && bufferSize)
		logBuffer[0] = 0;
	return instantiate(phGraphExec, hGraph);
}

RC_API CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
				   size_t bufferSize)
{
	RC_GATE();
	return instantiate_logged(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

RC_API CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
				      char *logBuffer, size_t bufferSize)
{
	RC_GATE();
	return instantiate_logged(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

/* Every node onto the stream in order; on a capturing stream they join its capture. */
static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream, int per_thread)
{
	struct CUgraphExec_st *x = exec_check(hGraphExec);
	if (!x)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!rc_stream_resolve(hStream, per_thread))
		return CUDA_ERROR_INVALID_HANDLE;
	for (size_t i = 0; i < x->nodes.n; i++) {
		/* rc_stream_submit takes the event reference it needs; a kernel runs once */
		struct rc_op d = x->nodes.op[i];
		if (d.type == OP_KERNEL && !(d.k = launch_dup(d.k)))
			return CUDA_ERROR_OUT_OF_MEMORY;
		CUresult r = rc_stream_submit(hStream, per_thread, &d);
		if (r != CUDA_SUCCESS) {
			if (d.type == OP_KERNEL)
				free(d.k);
			return r;
		}
	}
	return CUDA_SUCCESS;
}

RC_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	RC_GATE();
	return graph_launch(hGraphExec, hStream, 0);
}

RC_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	RC_GATE();
	return graph_launch(hGraphExec, hStream, 1);
}

/* As on NVIDIA's driver, work already launched from it still runs: it owns copies. */
RC_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	RC_GATE();
	struct CUgraphExec_st *x = exec_check(hGraphExec);
	if (!x)
		return CUDA_ERROR_INVALID_HANDLE;
	nodes_free(&x->nodes);
	x->magic = 0;
	free(x);
	return CUDA_SUCCESS;
}

RC_API CUresult cuGraphDestroy(CUgraph hGraph)
{
	RC_GATE();
	struct CUgraph_st *g = graph_check(hGraph);
	if (!g)
		return CUDA_ERROR_INVALID_HANDLE;
	rc_graph_free(g);
	return CUDA_SUCCESS;
}
