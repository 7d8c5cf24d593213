/*
 * Movers: the threads that stand for hardware moving bytes (a stream's copy engine
 * here, the RDMA provider's NIC thread in rdma/provider.c). Hardware is not delayed
 * by the CPU scheduler, and the lane model charges a mover's lateness to the lane
 * (a chunk reserved more than CATCH_UP_NS after the previous one ended leaves a
 * gap), so on a machine whose CPUs are all busy an ordinary thread would make the
 * lanes run well below their rate: two flows meant to saturate a lane would not.
 * A mover therefore asks for SCHED_FIFO, at priority 2: above the scenario threads
 * that bear a shape and run at priority 1 (submit_as_mover, kvpath/calls.c), which
 * would otherwise keep a mover off a CPU while they submit. It sleeps between
 * chunks and spends a fraction of the lane's time copying, so it never holds a CPU;
 * the kernel's RT throttling bounds it anyway. Without the privilege (no root,
 * CAP_SYS_NICE or RLIMIT_RTPRIO) it stays an ordinary thread and the lanes may fall
 * behind under load, which the scenarios' own rates then show.
 *
 * LW_REF_MOVERS=ordinary keeps them ordinary threads. A real GPU's engine takes
 * no host CPU; these take what a lane's chunks cost, and at SCHED_FIFO they take
 * it first: on a machine of two CPUs an engine woken for each of a copier's
 * small copies holds most of one CPU ahead of every ordinary thread, an
 * observer's included (docs/measurements.md, "The whole agent").
 */
#include "internal.h"
#include <sched.h>
#include <stdlib.h>
#include <string.h>

void rc_mover_thread(void)
{
	const char *v = getenv("LW_REF_MOVERS");
	if (v && !strcmp(v, "ordinary"))
		return;
	struct sched_param p = {.sched_priority = 2};
	(void)pthread_setschedparam(pthread_self(), SCHED_FIFO, &p);
}
