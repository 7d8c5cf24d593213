// Package otlpbridge receives the inference server's OTLP traces, forwards
// them unchanged to the upstream collector, and keeps a short, bounded index
// of their spans so that each transfer the agent observes can be attributed
// to the request (and the span of the thread) it served.
//
// Attribution: a transfer submitted on thread tid of process pid at time t
// belongs to the request whose span covers t on that thread. SGLang
// (--enable-trace) names a thread in its per-thread spans (attribute `pid`,
// which holds the thread id) and the request in the trace's root span
// `Req …` (attributes `rid`, `bootstrap_room`); vLLM (--otlp-traces-endpoint)
// emits one `llm_request` span per request (`gen_ai.request.id`) without a
// thread, so it attributes by process and time. When spans of several
// requests cover the transfer, the transfer served a batch: the answer lists
// them (capped) instead of picking one.
//
// Clocks: span timestamps are Unix ns (wall clock); transfers carry
// CLOCK_MONOTONIC ns. Clock converts with an offset measured at start and
// refreshed periodically, so a wall-clock step is followed within one
// refresh.
package otlpbridge

import (
	"fmt"
	"regexp"
	"strings"
)

// Scope says how a rule's spans attribute transfers.
type Scope string

const (
	// ScopeThread: the span covers one thread (Rule.Thread names the
	// attribute holding its tid); its request is its own Rule.Request
	// attribute or, absent that, the request of its trace.
	ScopeThread Scope = "thread"
	// ScopeProcess: the span covers a whole process (Rule.Process names the
	// span or resource attribute holding its pid; absent: any process).
	ScopeProcess Scope = "process"
	// ScopeTrace: the span only names the request of its trace (SGLang's
	// root span lives in another process than the copies).
	ScopeTrace Scope = "trace"
)

// Rule maps spans of one shape to request identity. The first rule whose
// name pattern matches and whose required attributes are present wins.
type Rule struct {
	Name    string         // shown as lanewatch.attribution
	Span    *regexp.Regexp // span name pattern
	Request string         // attribute with the request id ("": the trace's request)
	Thread  string         // ScopeThread: attribute with the thread id
	Process string         // ScopeProcess: span or resource attribute with the pid ("": any process)
	Scope   Scope
}

// DefaultRules are the built-in rules for SGLang and vLLM.
func DefaultRules() []Rule {
	return []Rule{
		{Name: "sglang-request", Span: regexp.MustCompile(`^Req `), Request: "rid", Scope: ScopeTrace},
		{Name: "sglang-thread", Span: regexp.MustCompile(``), Thread: "pid", Scope: ScopeThread},
		{Name: "vllm-request", Span: regexp.MustCompile(`^llm_request$`), Request: "gen_ai.request.id", Process: "process.pid", Scope: ScopeProcess},
	}
}

// ParseRule parses one rule from its flag form:
//
//	name=NAME,span=REGEXP,scope=thread|process|trace[,request=ATTR][,thread=ATTR][,process=ATTR]
//
// A comma inside the regular expression is written as \,.
func ParseRule(s string) (Rule, error) {
	var r Rule
	var span string
	haveSpan := false
	for _, kv := range splitUnescaped(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return r, fmt.Errorf("rule %q: %q is not key=value", s, kv)
		}
		switch k {
		case "name":
			r.Name = v
		case "span":
			span, haveSpan = v, true
		case "request":
			r.Request = v
		case "thread":
			r.Thread = v
		case "process":
			r.Process = v
		case "scope":
			r.Scope = Scope(v)
		default:
			return r, fmt.Errorf("rule %q: unknown key %q (name, span, scope, request, thread, process)", s, k)
		}
	}
	if r.Name == "" || !haveSpan {
		return r, fmt.Errorf("rule %q: name and span are required", s)
	}
	re, err := regexp.Compile(span)
	if err != nil {
		return r, fmt.Errorf("rule %q: span pattern: %w", s, err)
	}
	r.Span = re
	switch r.Scope {
	case ScopeThread:
		if r.Thread == "" {
			return r, fmt.Errorf("rule %q: scope thread needs thread=ATTR", s)
		}
	case ScopeTrace:
		if r.Request == "" {
			return r, fmt.Errorf("rule %q: scope trace needs request=ATTR", s)
		}
	case ScopeProcess:
		if r.Request == "" {
			return r, fmt.Errorf("rule %q: scope process needs request=ATTR", s)
		}
	default:
		return r, fmt.Errorf("rule %q: scope %q is not thread, process or trace", s, r.Scope)
	}
	return r, nil
}

func splitUnescaped(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s) && s[i+1] == ',':
			cur.WriteByte(',')
			i++
		case s[i] == ',':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(out, cur.String())
}
