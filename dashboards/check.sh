#!/usr/bin/env bash
# Checks the shipped alerting rules with promtool: syntax and templates
# (check rules), then the unit tests that make every alert fire and not fire
# (test rules). `make test` runs it; promtool comes with Debian's prometheus
# package (apt-get install prometheus).
set -euo pipefail
cd "$(dirname "$0")"
command -v promtool >/dev/null || { echo "dashboards/check.sh: promtool not found (apt-get install prometheus)" >&2; exit 1; }
promtool check rules lanewatch.rules.yml
promtool test rules lanewatch.rules.test.yml
