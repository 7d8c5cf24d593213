/*
 * The reference NVML stand-in (build/nvml/libnvidia-ml.so.1): the NVML functions
 * lanewatch's NVML collector calls (through go-nvml), with the real names and C
 * signatures, serving the reference path's GPUs instead of real ones. It is never
 * installed: it is loaded only by a program pointed at its path.
 *
 * Devices: one per shared GPU file /dev/shm/lw-ref-<name> (a process that ran with
 * LW_REF_GPU=<name>) whose head has the current layout (struct refcudaLaneHead),
 * found at nvmlInit and sorted by name, so indices are stable for a given set.
 * Per device:
 *   name    "ref-<name>"
 *   UUID    "GPU-" + the 32 hex digits of two FNV-1a-64 hashes (of "<name>" and of
 *           "lw-ref:<name>") as 8-4-4-4-12, so it is the same on every run;
 *   bus id  "0000F%03X:%02X:00.0": domain 0xF000 | bits 8..19 of FNV-1a-64(name),
 *           bus = its low byte. Domain 0xFxxx marks a reference device (no real
 *           host has it in sysfs); pciDeviceId 0x000010DE (vendor NVIDIA, device 0).
 *   PCIe byte counters: field values NVML_FI_DEV_PCIE_COUNT_RX_BYTES (host to
 *           device, the inbound lane's cumulative bytes) and _TX_BYTES (outbound);
 *           nvmlDeviceGetPcieThroughput: KB/s of the same counters over a 20 ms
 *           window, as the real function measures.
 *   link    max (nvmlDeviceGetMaxPcieLinkGeneration/Width: what the device and
 *           system support) generation 5, width 16, or LW_REF_NVML_MAX_LINK
 *           ("GENxWIDTH", e.g. "4x8"); current (nvmlDeviceGetCurrPcieLinkGeneration/
 *           Width) the max, or LW_REF_NVML_LINK: the state the link trains to under
 *           load. With LW_REF_NVML_IDLE_LINK the link trains down when idle, as real
 *           GPUs do ("These may be reduced when the GPU is not in use", nvidia-smi;
 *           the samples' idle GPUs read Gen1): current is the idle state once
 *           neither lane has carried traffic for LW_REF_NVML_IDLE_MS (1000 by
 *           default; the lanes' busy_until_ns stamps), and the loaded state again
 *           as soon as one does.
 *   replay  counter 0, or LW_REF_NVML_REPLAY.
 * LW_REF_NVML_NO_PCIE_FIELDS=1 makes the PCIe byte fields NOT_SUPPORTED (as on GPUs
 * older than Hopper), so a reader falls back to nvmlDeviceGetPcieThroughput.
 *   NVLink  none: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX are NOT_SUPPORTED, as on
 *           a GPU without NVLink; with LW_REF_NVML_NVLINK_KIB="TX,RX" every device
 *           answers those KiB totals for scopeId UINT_MAX (all links; a single
 *           link's id is NOT_SUPPORTED). The reference path moves nothing over
 *           NVLink: the totals are what the test gives, for the read path only.
 */
#include "refcuda.h"
#include "refnvml.h"
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define MAX_DEVICES 64

struct nvmlDevice_st {
	unsigned int index;
	char name[REFCUDA_LANE_NAME_MAX];
	char uuid[48];
	unsigned int domain, bus;
	const struct refcudaLaneHead *head; /* mapped read-only */
};

static struct {
	pthread_mutex_t mu;
	int inits; /* nvmlInit minus nvmlShutdown */
	unsigned int n;
	struct nvmlDevice_st dev[MAX_DEVICES];
	unsigned int gen, width, max_gen, max_width, replay;
	unsigned int idle_gen, idle_width; /* 0: the link never trains down */
	uint64_t idle_ns;
	int no_fields;
	int nvlink; /* LW_REF_NVML_NVLINK_KIB given */
	unsigned long long nvlink_tx_kib, nvlink_rx_kib;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* FNV-1a-64 and the PCI identity are refcuda.h's: the reference driver's
 * cuDeviceGetPCIBusId names the same address. */
#define fnv1a refcudaFNV1a

static void link_env(const char *var, unsigned int *gen, unsigned int *width)
{
	const char *v = getenv(var);
	unsigned int g, w;
	if (v && sscanf(v, "%ux%u", &g, &w) == 2 && g && w) {
		*gen = g;
		*width = w;
	}
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct nvmlDevice_st *)a)->name, ((const struct nvmlDevice_st *)b)->name);
}

/* Maps the head of /dev/shm/<file> read-only if it is a current-layout GPU file. */
static const struct refcudaLaneHead *map_head(const char *file)
{
	char path[300];
	snprintf(path, sizeof path, "/dev/shm/%s", file);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct stat st;
	void *p = MAP_FAILED;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size >= sizeof(struct refcudaLaneHead))
		p = mmap(NULL, sizeof(struct refcudaLaneHead), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	const struct refcudaLaneHead *h = p;
	if (h->magic != REFCUDA_LANE_MAGIC || __atomic_load_n(&h->state, __ATOMIC_ACQUIRE) != REFCUDA_LANE_READY) {
		munmap(p, sizeof *h);
		return NULL;
	}
	return h;
}

static void scan(void)
{
	S.n = 0;
	DIR *d = opendir("/dev/shm");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) && S.n < MAX_DEVICES) {
		/* lw-ref-<name>; lw-ref-wire-* are the RDMA wires, not GPUs (the magic tells too) */
		if (strncmp(e->d_name, "lw-ref-", 7) || !strncmp(e->d_name, "lw-ref-wire-", 12))
			continue;
		const char *name = e->d_name + 7;
		if (!*name || strlen(name) >= REFCUDA_LANE_NAME_MAX)
			continue;
		const struct refcudaLaneHead *h = map_head(e->d_name);
		if (!h)
			continue;
		struct nvmlDevice_st *v = &S.dev[S.n++];
		memset(v, 0, sizeof *v);
		snprintf(v->name, sizeof v->name, "%s", name);
		v->head = h;
		uint64_t a = fnv1a(name, ""), b = fnv1a("lw-ref:", name);
		snprintf(v->uuid, sizeof v->uuid, "GPU-%08x-%04x-%04x-%04x-%012llx", (unsigned)(a >> 32),
			 (unsigned)(a >> 16) & 0xffff, (unsigned)a & 0xffff, (unsigned)(b >> 48),
			 (unsigned long long)(b & 0xffffffffffffull));
		refcudaGPUIdentity(name, &v->domain, &v->bus);
	}
	closedir(d);
	qsort(S.dev, S.n, sizeof S.dev[0], by_name);
	for (unsigned int i = 0; i < S.n; i++)
		S.dev[i].index = i;
}

static void unmap_all(void)
{
	for (unsigned int i = 0; i < S.n; i++)
		munmap((void *)S.dev[i].head, sizeof *S.dev[i].head);
	S.n = 0;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	pthread_mutex_lock(&S.mu);
	if (S.inits++ == 0) {
		S.gen = S.max_gen = 5;
		S.width = S.max_width = 16;
		link_env("LW_REF_NVML_MAX_LINK", &S.max_gen, &S.max_width);
		S.gen = S.max_gen;
		S.width = S.max_width;
		link_env("LW_REF_NVML_LINK", &S.gen, &S.width);
		S.idle_gen = S.idle_width = 0;
		link_env("LW_REF_NVML_IDLE_LINK", &S.idle_gen, &S.idle_width);
		const char *ims = getenv("LW_REF_NVML_IDLE_MS");
		S.idle_ns = (ims && *ims ? strtoull(ims, NULL, 0) : 1000ull) * 1000000ull;
		const char *r = getenv("LW_REF_NVML_REPLAY");
		S.replay = r ? (unsigned int)strtoul(r, NULL, 0) : 0;
		const char *nf = getenv("LW_REF_NVML_NO_PCIE_FIELDS");
		S.no_fields = nf && *nf && strcmp(nf, "0") != 0;
		const char *nv = getenv("LW_REF_NVML_NVLINK_KIB");
		S.nvlink = nv && sscanf(nv, "%llu,%llu", &S.nvlink_tx_kib, &S.nvlink_rx_kib) == 2;
		scan();
	}
	pthread_mutex_unlock(&S.mu);
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlInit(void)
{
	return nvmlInitWithFlags(0);
}

API nvmlReturn_t nvmlShutdown(void)
{
	pthread_mutex_lock(&S.mu);
	nvmlReturn_t ret = NVML_SUCCESS;
	if (S.inits == 0)
		ret = NVML_ERROR_UNINITIALIZED;
	else if (--S.inits == 0)
		unmap_all();
	pthread_mutex_unlock(&S.mu);
	return ret;
}

API const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_UNINITIALIZED:
		return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED:
		return "Not Supported";
	case NVML_ERROR_NOT_FOUND:
		return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED:
		return "Driver Not Loaded";
	default:
		return "Unknown Error";
	}
}

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *s)
{
	if (!dst)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (strlen(s) + 1 > len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(dst, s, strlen(s) + 1);
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	return copy_str(version, length, "lanewatch-ref");
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	return copy_str(version, length, "12.lanewatch-ref");
}

/* Valid handle: one of ours while initialised. */
static const struct nvmlDevice_st *dev_of(nvmlDevice_t d)
{
	if (!S.inits)
		return NULL;
	if ((uintptr_t)d < (uintptr_t)S.dev || (uintptr_t)d >= (uintptr_t)(S.dev + S.n))
		return NULL;
	return d;
}

#define DEV_OR_FAIL(d, v)                                              \
	const struct nvmlDevice_st *v = dev_of(d);                     \
	if (!S.inits)                                                  \
		return NVML_ERROR_UNINITIALIZED;                       \
	if (!v)                                                        \
		return NVML_ERROR_INVALID_ARGUMENT

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!S.inits)
		return NVML_ERROR_UNINITIALIZED;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = S.n;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
	return nvmlDeviceGetCount_v2(count);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!S.inits)
		return NVML_ERROR_UNINITIALIZED;
	if (!device || index >= S.n)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &S.dev[index];
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	DEV_OR_FAIL(device, v);
	if (!index)
		return NVML_ERROR_INVALID_ARGUMENT;
	*index = v->index;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	DEV_OR_FAIL(device, v);
	char buf[REFCUDA_LANE_NAME_MAX + 8];
	snprintf(buf, sizeof buf, "ref-%s", v->name);
	return copy_str(name, length, buf);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	DEV_OR_FAIL(device, v);
	return copy_str(uuid, length, v->uuid);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	DEV_OR_FAIL(device, v);
	if (!pci)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(pci, 0, sizeof *pci);
	pci->domain = v->domain;
	pci->bus = v->bus;
	pci->device = 0;
	pci->pciDeviceId = 0x000010deu;
	snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:00.0", v->domain, v->bus);
	snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:00.0", v->domain & 0xffff, v->bus);
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return nvmlDeviceGetPciInfo_v3(device, pci);
}

static uint64_t lane_bytes(const struct nvmlDevice_st *v, int inbound)
{
	return __atomic_load_n(&v->head->bytes[inbound ? 0 : 1], __ATOMIC_RELAXED);
}

API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
	DEV_OR_FAIL(device, v);
	if (valuesCount < 0 || (valuesCount > 0 && !values))
		return NVML_ERROR_INVALID_ARGUMENT;
	struct timeval tv;
	gettimeofday(&tv, NULL);
	for (int i = 0; i < valuesCount; i++) {
		nvmlFieldValue_t *f = &values[i];
		f->timestamp = (long long)tv.tv_sec * 1000000 + tv.tv_usec;
		f->latencyUsec = 0;
		f->nvmlReturn = NVML_SUCCESS;
		switch (f->fieldId) {
		case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
		case NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
			if (S.no_fields) {
				f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
				break;
			}
			f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
			f->value.ullVal = lane_bytes(v, f->fieldId == NVML_FI_DEV_PCIE_COUNT_RX_BYTES);
			break;
		case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
		case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
			if (!S.nvlink || f->scopeId != UINT_MAX) {
				f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
				break;
			}
			f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
			f->value.ullVal = f->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? S.nvlink_tx_kib : S.nvlink_rx_kib;
			break;
		case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
			f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
			f->value.uiVal = S.replay;
			break;
		default:
			f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
		}
	}
	return NVML_SUCCESS;
}

#define THROUGHPUT_WINDOW_NS 20000000ull

API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value)
{
	DEV_OR_FAIL(device, v);
	if (!value || (counter != NVML_PCIE_UTIL_TX_BYTES && counter != NVML_PCIE_UTIL_RX_BYTES))
		return NVML_ERROR_INVALID_ARGUMENT;
	int inbound = counter == NVML_PCIE_UTIL_RX_BYTES;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	uint64_t b0 = lane_bytes(v, inbound);
	struct timespec w = {0, (long)THROUGHPUT_WINDOW_NS};
	nanosleep(&w, NULL);
	uint64_t b1 = lane_bytes(v, inbound);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	*value = (unsigned int)((double)(b1 - b0) / s / 1024.0 + 0.5);
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
	DEV_OR_FAIL(device, v);
	(void)v;
	if (!value)
		return NVML_ERROR_INVALID_ARGUMENT;
	*value = S.replay;
	return NVML_SUCCESS;
}

static nvmlReturn_t link_value(nvmlDevice_t device, unsigned int *out, unsigned int val)
{
	DEV_OR_FAIL(device, v);
	(void)v;
	if (!out)
		return NVML_ERROR_INVALID_ARGUMENT;
	*out = val;
	return NVML_SUCCESS;
}

/* Idle: neither lane has had lane time reserved within the last idle_ns. */
static int link_idle(nvmlDevice_t device)
{
	const struct nvmlDevice_st *v = dev_of(device);
	if (!v || !S.idle_gen)
		return 0;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	for (int i = 0; i < 2; i++)
		if (__atomic_load_n(&v->head->busy_until_ns[i], __ATOMIC_RELAXED) + S.idle_ns > now)
			return 0;
	return 1;
}

API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *v)
{
	return link_value(device, v, link_idle(device) ? S.idle_gen : S.gen);
}

API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *v)
{
	return link_value(device, v, S.max_gen);
}

API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *v)
{
	return link_value(device, v, link_idle(device) ? S.idle_width : S.width);
}

API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *v)
{
	return link_value(device, v, S.max_width);
}
