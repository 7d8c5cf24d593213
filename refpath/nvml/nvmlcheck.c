/*
 * nvmlcheck --lib LIB --gpu NAME --truth FILE -- KVPATH [ARGS...]
 *
 * Reads the NVML stand-in the way an NVML client does (dlopen LIB, the exported
 * functions by name) around one run of a kvpath scenario: runs the command with
 * LW_REF_GPU=NAME and --hold --truth FILE appended, waits for its "ready" line,
 * reads device "ref-NAME"'s PCIe RX/TX byte fields, lets it go, reads them again
 * after it exits, and checks the counters' increase against the end line's
 * lane_bytes (h2d = RX, d2h = TX) within 2%. Prints one JSON line; exit 0 if good.
 */
#include "refnvml.h"
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SYM(name) name##_fn = (__typeof__(&name))dlsym(h, #name)
static __typeof__(&nvmlInit_v2) nvmlInit_v2_fn;
static __typeof__(&nvmlShutdown) nvmlShutdown_fn;
static __typeof__(&nvmlDeviceGetCount_v2) nvmlDeviceGetCount_v2_fn;
static __typeof__(&nvmlDeviceGetHandleByIndex_v2) nvmlDeviceGetHandleByIndex_v2_fn;
static __typeof__(&nvmlDeviceGetName) nvmlDeviceGetName_fn;
static __typeof__(&nvmlDeviceGetFieldValues) nvmlDeviceGetFieldValues_fn;

static void die(const char *msg)
{
	fprintf(stderr, "nvmlcheck: %s\n", msg);
	exit(1);
}

/* RX (host to device) and TX byte fields of device ref-<gpu>, read in a fresh session. */
static void read_counters(const char *gpu, unsigned long long *rx, unsigned long long *tx)
{
	if (nvmlInit_v2_fn() != NVML_SUCCESS)
		die("nvmlInit_v2 failed");
	unsigned int n = 0;
	if (nvmlDeviceGetCount_v2_fn(&n) != NVML_SUCCESS)
		die("nvmlDeviceGetCount_v2 failed");
	char want[96];
	snprintf(want, sizeof want, "ref-%s", gpu);
	for (unsigned int i = 0; i < n; i++) {
		nvmlDevice_t d;
		char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
		if (nvmlDeviceGetHandleByIndex_v2_fn(i, &d) != NVML_SUCCESS ||
		    nvmlDeviceGetName_fn(d, name, sizeof name) != NVML_SUCCESS || strcmp(name, want))
			continue;
		nvmlFieldValue_t f[2] = {{.fieldId = NVML_FI_DEV_PCIE_COUNT_RX_BYTES},
					 {.fieldId = NVML_FI_DEV_PCIE_COUNT_TX_BYTES}};
		if (nvmlDeviceGetFieldValues_fn(d, 2, f) != NVML_SUCCESS || f[0].nvmlReturn != NVML_SUCCESS ||
		    f[1].nvmlReturn != NVML_SUCCESS || f[0].valueType != NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
			die("PCIe byte fields unavailable");
		*rx = f[0].value.ullVal;
		*tx = f[1].value.ullVal;
		nvmlShutdown_fn();
		return;
	}
	fprintf(stderr, "nvmlcheck: no device %s among %u\n", want, n);
	exit(1);
}

static unsigned long long end_field(const char *line, const char *obj, const char *key)
{
	const char *o = strstr(line, obj);
	const char *k = o ? strstr(o, key) : NULL;
	if (!k)
		die("end line lacks lane_bytes");
	return strtoull(k + strlen(key), NULL, 10);
}

int main(int argc, char **argv)
{
	const char *lib = NULL, *gpu = NULL, *truth = NULL;
	int i = 1;
	for (; i < argc; i++) {
		if (!strcmp(argv[i], "--") ) {
			i++;
			break;
		}
		if (i + 1 >= argc)
			die("usage: nvmlcheck --lib LIB --gpu NAME --truth FILE -- KVPATH [ARGS...]");
		if (!strcmp(argv[i], "--lib"))
			lib = argv[++i];
		else if (!strcmp(argv[i], "--gpu"))
			gpu = argv[++i];
		else if (!strcmp(argv[i], "--truth"))
			truth = argv[++i];
		else
			die("unknown argument");
	}
	if (!lib || !gpu || !truth || i >= argc)
		die("usage: nvmlcheck --lib LIB --gpu NAME --truth FILE -- KVPATH [ARGS...]");

	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "nvmlcheck: %s\n", dlerror());
		return 1;
	}
	SYM(nvmlInit_v2);
	SYM(nvmlShutdown);
	SYM(nvmlDeviceGetCount_v2);
	SYM(nvmlDeviceGetHandleByIndex_v2);
	SYM(nvmlDeviceGetName);
	SYM(nvmlDeviceGetFieldValues);
	if (!nvmlInit_v2_fn || !nvmlShutdown_fn || !nvmlDeviceGetCount_v2_fn || !nvmlDeviceGetHandleByIndex_v2_fn ||
	    !nvmlDeviceGetName_fn || !nvmlDeviceGetFieldValues_fn)
		die("a symbol is missing");

	/* the scenario, held after its setup */
	int to[2], from[2];
	if (pipe(to) || pipe(from))
		die("pipe");
	char **args = calloc((size_t)(argc - i) + 4, sizeof *args);
	int n = 0;
	for (int k = i; k < argc; k++)
		args[n++] = argv[k];
	args[n++] = "--hold";
	args[n++] = "--truth";
	args[n++] = (char *)truth;
	setenv("LW_REF_GPU", gpu, 1);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		dup2(to[0], 0);
		dup2(from[1], 1);
		close(to[1]);
		close(from[0]);
		execv(args[0], args);
		_exit(127);
	}
	close(to[0]);
	close(from[1]);
	FILE *out = fdopen(from[0], "r");
	char line[4096];
	if (!fgets(line, sizeof line, out) || strncmp(line, "ready", 5)) {
		kill(pid, SIGKILL);
		die("scenario did not reach its hold point");
	}
	unsigned long long rx0, tx0, rx1, tx1;
	read_counters(gpu, &rx0, &tx0);
	if (write(to[1], "go\n", 3) != 3)
		die("write");
	close(to[1]);
	while (fgets(line, sizeof line, out))
		fputs(line, stdout);
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("scenario failed");
	read_counters(gpu, &rx1, &tx1);

	FILE *t = fopen(truth, "r");
	if (!t)
		die("cannot open the truth file");
	char last[4096] = "";
	while (fgets(line, sizeof line, t))
		if (strstr(line, "\"end\":true"))
			snprintf(last, sizeof last, "%s", line);
	fclose(t);
	unsigned long long want_rx = end_field(last, "\"lane_bytes\"", "\"h2d\":");
	unsigned long long want_tx = end_field(last, "\"lane_bytes\"", "\"d2h\":");
	unsigned long long drx = rx1 - rx0, dtx = tx1 - tx0;
	double erx = want_rx ? ((double)drx - (double)want_rx) / (double)want_rx : 1;
	double etx = want_tx ? ((double)dtx - (double)want_tx) / (double)want_tx : 1;
	int ok = erx <= 0.02 && erx >= -0.02 && etx <= 0.02 && etx >= -0.02;
	printf("{\"gpu\":\"ref-%s\",\"rx_bytes\":%llu,\"tx_bytes\":%llu,\"lane_h2d\":%llu,\"lane_d2h\":%llu,"
	       "\"rx_err\":%.5f,\"tx_err\":%.5f,\"ok\":%s}\n",
	       gpu, drx, dtx, want_rx, want_tx, erx, etx, ok ? "true" : "false");
	return ok ? 0 : 1;
}
