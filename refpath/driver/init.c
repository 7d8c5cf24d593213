/* Process-wide initialisation of the reference driver: read the environment once. */
#include "internal.h"
#include <stdlib.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;

static double env_double(const char *name, double def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	double d = strtod(v, &end);
	return (end != v && d > 0) ? d : def;
}

static void do_init(void)
{
	double mb = env_double("LW_REF_DEVICE_MB", 512);
	rc_mem_init((size_t)(mb * 1024 * 1024));
	rc_lane_init(env_double("LW_REF_H2D_GBPS", 4), env_double("LW_REF_D2H_GBPS", 4));
	rc_streams_init();
}

/* Every entry point calls this; after the first call it is one load and a branch. */
void rc_init(void)
{
	pthread_once(&once, do_init);
}

RC_API CUresult cuInit(unsigned int Flags)
{
	(void)Flags;
	rc_init();
	return CUDA_SUCCESS;
}
