// Package otlpbridge receives the inference server's OTLP traces, forwards
// them unchanged to the upstream collector, and keeps a short, bounded index
// of their spans so that each transfer the agent observes can be attributed
// to the request (and the span of the thread) it served.
//
// Attribution (docs/design.md §7, "Spans"): a transfer submitted on thread
// tid of process pid at time t belongs to the request whose span covers t on
// that thread, else in that process. What a span is comes from rules
// (DefaultRules, or --otlp.rule) matching its name and attributes:
//
//   - thread spans cover one native thread: SGLang's per-(request, thread)
//     span `{label} [TP n] (host:xxxxxxxx | pid:TID)` (attributes pid =
//     the thread id, host_id, thread_label) and its HiCache storage spans;
//   - slices are the children of a thread span (SGLang's prefill_forward,
//     decode_forward, …): they carry no thread of their own, inherit their
//     parent's, and the forward slices narrow the request's window so that
//     requests queued on the thread do not join the batch it served;
//   - request spans name the request of their trace (SGLang's
//     `{role} Req {rid[:8]}`, rid, bootstrap_room), and bootstrap rooms join
//     the traces of one request (prefill, decode, mooncake);
//   - process spans cover a process tree (vLLM's llm_request, resource
//     vllm.process_id: the API server, with EngineCore and the workers below
//     it) or, with no such attribute, any process.
//
// When spans of several requests cover the transfer, it served a batch: the
// answer lists them (capped) instead of picking one.
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

// Scope says what a rule's spans are.
type Scope string

const (
	// ScopeThread: the span covers one thread (Rule.Thread names the
	// attribute holding its native id, Rule.Host the attribute naming the
	// host that id belongs to); its request is its own Rule.Request
	// attribute or, absent that, the request of its trace.
	ScopeThread Scope = "thread"
	// ScopeSlice: a child of a thread span or of another slice. It has no
	// thread of its own: it inherits its parent's, and gives a transfer
	// inside it a finer parent. Rule.Narrow slices (forward passes) also
	// narrow the request's window on that thread.
	ScopeSlice Scope = "slice"
	// ScopeProcess: the span covers a process tree (Rule.Process names the
	// span or resource attribute holding the tree's root pid; absent: any
	// process).
	ScopeProcess Scope = "process"
	// ScopeTrace: the span only names the request of its trace
	// (Rule.Request) and/or the bootstrap room that joins the traces of one
	// request (Rule.Room).
	ScopeTrace Scope = "trace"
)

// AttrMatch requires a span attribute: present, and when Value is set,
// matching it (the attribute's text form: ints in decimal).
type AttrMatch struct {
	Key   string
	Value *regexp.Regexp // nil: presence only
}

// Rule maps spans of one shape to what they mean for attribution. The first
// rule whose name pattern and attribute filters match wins.
type Rule struct {
	Name    string         // shown as lanewatch.attribution
	Span    *regexp.Regexp // span name pattern
	Attrs   []AttrMatch    // every one must match
	Scope   Scope
	Request string // attribute with the request id ("": the trace's request)
	Room    string // attribute with the bootstrap room joining a request's traces
	Thread  string // ScopeThread: attribute with the native thread id
	Host    string // ScopeThread: attribute naming the thread's host ("": any host)
	Process string // ScopeProcess: span or resource attribute with the tree's root pid ("": any process)
	Narrow  bool   // ScopeSlice: a transfer inside it leaves out the thread's requests without one
}

// Patterns of the built-in rules (docs/design.md §7, "Spans"; the shapes and
// the sources they come from are in otlpbridge/shapes).
const (
	// SGLang's request span: `Req 1a2b3c4d` (Sept 2025), `{role} Req
	// 1a2b3c4d` since the October 2025 rework, role "" for unified servers
	// (a leading space), prefill, decode, or Sender for mooncake's.
	PatternSGLangRequest = `(^|\s)Req \S`
	// SGLang's thread span name ends in `(host:xxxxxxxx | pid:TID)`.
	PatternSGLangThread = `\(host:\S* \| pid:[0-9]+\)$`
	// SGLang's request stages during which the thread runs the request's
	// forward pass (req_time_stats.RequestStage): the innermost one that
	// covers a transfer wins.
	PatternSGLangForward = `^(prefill_forward|decode_forward|chunked_prefill|decode_loop|run_batch_cpu)$`
	// Every other SGLang request stage (snake_case names).
	PatternSGLangSlice = `^[a-z][a-z0-9_]*$`
	// HiCache's storage operations (--trace-modules hicache): separate
	// traces, pid = native thread id; hicache_l3_backup,
	// hicache_l3_prefetch_query and hicache_l3_prefetch_transfer on
	// background threads, the zero-length *_enqueue ones on the scheduler's.
	PatternSGLangHiCache = `^hicache_l3_`
)

// DefaultRules are the built-in rules for SGLang (every release with
// --enable-trace) and vLLM (--otlp-traces-endpoint).
func DefaultRules() []Rule {
	re := regexp.MustCompile
	return []Rule{
		{Name: "sglang-hicache", Span: re(PatternSGLangHiCache), Attrs: []AttrMatch{{Key: "module", Value: re(`^sglang::hicache$`)}},
			Scope: ScopeThread, Thread: "pid", Host: "host_id", Request: "hicache.request_id"},
		// mooncake's `Sender Req 0x…`: its rid is the bootstrap room, not
		// a request id; the room joins it to the request's own traces.
		{Name: "sglang-mooncake", Span: re(PatternSGLangRequest), Attrs: []AttrMatch{{Key: "module", Value: re(`^sglang::mooncake$`)}},
			Scope: ScopeTrace, Room: "bootstrap_room"},
		{Name: "sglang-request", Span: re(PatternSGLangRequest), Attrs: []AttrMatch{{Key: "rid"}}, Scope: ScopeTrace, Request: "rid", Room: "bootstrap_room"},
		// October 2025: the request span's parent, holding the room.
		{Name: "sglang-bootstrap", Span: re(`^Bootstrap Room `), Attrs: []AttrMatch{{Key: "bootstrap_room"}}, Scope: ScopeTrace, Room: "bootstrap_room"},
		{Name: "sglang-thread", Span: re(PatternSGLangThread), Attrs: []AttrMatch{{Key: "pid"}}, Scope: ScopeThread, Thread: "pid", Host: "host_id"},
		{Name: "sglang-thread", Span: re(``), Attrs: []AttrMatch{{Key: "thread_label"}, {Key: "pid"}}, Scope: ScopeThread, Thread: "pid", Host: "host_id"},
		{Name: "vllm-request", Span: re(`^llm_request$`), Attrs: []AttrMatch{{Key: "gen_ai.request.id"}},
			Scope: ScopeProcess, Request: "gen_ai.request.id", Process: "vllm.process_id"},
		{Name: "sglang-forward", Span: re(PatternSGLangForward), Scope: ScopeSlice, Narrow: true},
		{Name: "sglang-slice", Span: re(PatternSGLangSlice), Scope: ScopeSlice},
	}
}

// RuleSyntax is the --otlp.rule form, for flag help and errors.
const RuleSyntax = "name=N,span=REGEXP,scope=thread|slice|process|trace[,attr=KEY[=REGEXP]]...[,request=ATTR][,room=ATTR][,thread=ATTR][,host=ATTR][,process=ATTR][,narrow=true]"

// ParseRule parses one rule from its flag form (RuleSyntax). A comma inside
// a value is written as \,. attr= repeats: attr=KEY requires the attribute,
// attr=KEY=REGEXP also its value. Errors name the rule and the key.
func ParseRule(s string) (Rule, error) {
	var r Rule
	var span string
	haveSpan := false
	seen := map[string]bool{}
	for i, kv := range splitUnescaped(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return r, fmt.Errorf("rule %q: item %d %q is not key=value", s, i+1, kv)
		}
		if seen[k] && k != "attr" {
			return r, fmt.Errorf("rule %q: %s given twice", s, k)
		}
		seen[k] = true
		switch k {
		case "name":
			r.Name = v
		case "span":
			span, haveSpan = v, true
		case "request":
			r.Request = v
		case "room":
			r.Room = v
		case "thread":
			r.Thread = v
		case "host":
			r.Host = v
		case "process":
			r.Process = v
		case "scope":
			r.Scope = Scope(v)
		case "narrow":
			switch v {
			case "true":
				r.Narrow = true
			case "false":
			default:
				return r, fmt.Errorf("rule %q: narrow=%q: want true or false", s, v)
			}
		case "attr":
			key, val, hasVal := strings.Cut(v, "=")
			if key == "" {
				return r, fmt.Errorf("rule %q: attr=%q: empty attribute key", s, v)
			}
			m := AttrMatch{Key: key}
			if hasVal {
				re, err := regexp.Compile(val)
				if err != nil {
					return r, fmt.Errorf("rule %q: attr %s pattern: %w", s, key, err)
				}
				m.Value = re
			}
			r.Attrs = append(r.Attrs, m)
		default:
			return r, fmt.Errorf("rule %q: unknown key %q (want %s)", s, k, RuleSyntax)
		}
	}
	if r.Name == "" || !haveSpan {
		return r, fmt.Errorf("rule %q: name and span are required (%s)", s, RuleSyntax)
	}
	re, err := regexp.Compile(span)
	if err != nil {
		return r, fmt.Errorf("rule %q: span pattern: %w", s, err)
	}
	r.Span = re
	if r.Narrow && r.Scope != ScopeSlice {
		return r, fmt.Errorf("rule %q: narrow is for scope slice", s)
	}
	need := func(ok bool, what string) error {
		if !ok {
			return fmt.Errorf("rule %q: scope %s needs %s", s, r.Scope, what)
		}
		return nil
	}
	switch r.Scope {
	case ScopeThread:
		err = need(r.Thread != "", "thread=ATTR")
	case ScopeTrace:
		err = need(r.Request != "" || r.Room != "", "request=ATTR or room=ATTR")
	case ScopeProcess:
		err = need(r.Request != "", "request=ATTR")
	case ScopeSlice:
	default:
		err = fmt.Errorf("rule %q: scope %q is not thread, slice, process or trace", s, r.Scope)
	}
	if err != nil {
		return r, err
	}
	for _, k := range []struct{ key, val string }{{"thread", r.Thread}, {"host", r.Host}} {
		if k.val != "" && r.Scope != ScopeThread {
			return r, fmt.Errorf("rule %q: %s= is for scope thread", s, k.key)
		}
	}
	if r.Process != "" && r.Scope != ScopeProcess {
		return r, fmt.Errorf("rule %q: process= is for scope process", s)
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
