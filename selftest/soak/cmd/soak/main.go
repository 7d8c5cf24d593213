// Command soak runs the agent binary for a long time against the
// reference workload with process churn, OTLP traffic (normal and
// hostile), scrapes and a flapping upstream (package soak); `make soak`.
// Exit status 1: the soak failed; 2: it could not run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lanewatch/lanewatch/selftest/soak"
)

func main() { os.Exit(run()) }

func run() int {
	cfg := soak.Config{Out: os.Stdout, Hostile: soak.DefaultHostile}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.StringVar(&cfg.AgentBin, "agent", "bin/agent", "the agent binary")
	fs.StringVar(&cfg.RefDir, "refdir", "refpath/build", "the reference data path (make refpath)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "how long the load runs")
	fs.DurationVar(&cfg.Interval, "interval", 0, "between quiet points: one line each (0: a twelfth of the duration, 1s to 10s)")
	fs.DurationVar(&cfg.ExitLimit, "exit-limit", 2*time.Second, "the most a clean exit after SIGINT may take")
	fs.DurationVar(&cfg.WarmUp, "warmup", 0, "samples before this are not judged (0: a fifth of the duration)")
	fs.IntVar(&cfg.Slots, "slots", 2, "reference processes running at a time")
	hostile := fs.Bool("hostile", true, "hostile OTLP clients: oversized bodies, garbage, slow and idle connections")
	fs.IntVar(&cfg.Hostile.BodyBytes, "hostile.body", cfg.Hostile.BodyBytes, "size of the oversized body, bytes")
	fs.IntVar(&cfg.Hostile.Conns, "hostile.conns", cfg.Hostile.Conns, "idle connections held per round")
	fs.DurationVar(&cfg.Hostile.Every, "hostile.every", cfg.Hostile.Every, "between rounds of each hostile kind")
	fs.StringVar(&cfg.MemoryLimit, "memory-limit", "", "the agent's --memory-limit (empty: its default)")
	logPath := fs.String("agent-log", "", "write the agent's log here")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "soak: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if cfg.Duration <= 0 || cfg.Interval < 0 || cfg.ExitLimit <= 0 || cfg.WarmUp < 0 || cfg.Slots <= 0 || cfg.Hostile.BodyBytes < 0 || cfg.Hostile.Conns < 0 {
		fmt.Fprintln(os.Stderr, "soak: -duration, -exit-limit and -slots must be positive, -interval, -warmup and the hostile sizes not negative")
		return 2
	}
	if !*hostile {
		cfg.Hostile = soak.Hostile{}
	}
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 2
		}
		defer f.Close()
		cfg.AgentLog = f
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := soak.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	if !rep.OK() {
		return 1
	}
	return 0
}
