// Package dashboards ships lanewatch's Prometheus alerting rules
// (lanewatch.rules.yml, unit-tested by lanewatch.rules.test.yml through
// check.sh) and its Grafana dashboard (grafana/lanewatch.json). The Go tests
// here validate the dashboard and tie both to the exporter's metric names.
package dashboards

import _ "embed"

// Rules is lanewatch.rules.yml.
//
//go:embed lanewatch.rules.yml
var Rules []byte

// Grafana is grafana/lanewatch.json.
//
//go:embed grafana/lanewatch.json
var Grafana []byte

// RuleTests is lanewatch.rules.test.yml, promtool's test of every alert.
//
//go:embed lanewatch.rules.test.yml
var RuleTests []byte
