/*
 * kvpath --scenario NAME --truth FILE [--hold] [--layers N] [--layer-bytes B] [--iterations N] [--script FILE]
 *
 * One process runs one scenario against the reference CUDA runtime and writes
 * the ground truth (one JSON line per CUDA call, then an end line).
 */
#include "kvpath.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
	fprintf(f, "usage: kvpath --scenario NAME --truth FILE [--hold] [--layers N] [--layer-bytes B] "
		   "[--iterations N] [--script FILE (replay)]\nscenarios:");
	for (const struct scenario *s = scenarios; s->name; s++)
		fprintf(f, " %s", s->name);
	fputc('\n', f);
}

static unsigned long long parse_num(const char *flag, const char *v)
{
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v ? v : "", &end, 0);
	if (!v || errno || end == v || *end || n == 0) {
		fprintf(stderr, "kvpath: %s wants a positive number, got %s\n", flag, v ? v : "nothing");
		exit(2);
	}
	return n;
}

void hold_point(const struct opts *o)
{
	if (!o->hold)
		return;
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	char line[256];
	(void)!fgets(line, sizeof line, stdin); /* a line or EOF: either continues */
}

int main(int argc, char **argv)
{
	struct opts o = {0};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--scenario") && v) {
			o.scenario = v;
			i++;
		} else if (!strcmp(a, "--truth") && v) {
			o.truth = v;
			i++;
		} else if (!strcmp(a, "--script") && v) {
			o.script = v;
			i++;
		} else if (!strcmp(a, "--hold")) {
			o.hold = 1;
		} else if (!strcmp(a, "--layers")) {
			o.layers = (int)parse_num(a, v);
			i++;
		} else if (!strcmp(a, "--layer-bytes")) {
			o.layer_bytes = (size_t)parse_num(a, v);
			i++;
		} else if (!strcmp(a, "--iterations")) {
			o.iterations = (long)parse_num(a, v);
			i++;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else {
			fprintf(stderr, "kvpath: unknown or incomplete argument %s\n", a);
			usage(stderr);
			return 2;
		}
	}
	const struct scenario *sc = NULL;
	for (const struct scenario *s = scenarios; o.scenario && s->name; s++)
		if (!strcmp(s->name, o.scenario))
			sc = s;
	if (!sc) {
		fprintf(stderr, "kvpath: unknown scenario %s\n", o.scenario ? o.scenario : "(none)");
		usage(stderr);
		return 2;
	}
	if (sc->needs_truth && !o.truth) {
		fprintf(stderr, "kvpath: --truth FILE is required for %s\n", sc->name);
		return 2;
	}
	if (!o.layers)
		o.layers = sc->layers;
	if (!o.layer_bytes)
		o.layer_bytes = sc->layer_bytes;

	truth_init(sc->name, refcudaSetCopyRecords);
	struct result res = {{0}};
	int rc = sc->run(&o, &res);
	if (rc == 0 && o.truth && truth_write(o.truth, res.extra) != 0)
		rc = 1;
	return rc;
}
