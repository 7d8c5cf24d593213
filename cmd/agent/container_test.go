package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest"
)

// The capabilities the image's agent runs with (docs/deploy.md, "Least privilege").
var imageCaps = []string{"BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH", "CHECKPOINT_RESTORE"}

// podman runs podman with what this host's cgroup layout needs (crun fails
// on it; scripts/image/podman-setup.sh sets the rest).
func podman(args ...string) *exec.Cmd {
	return exec.Command("podman", append([]string{"--runtime", "runc", "--cgroup-manager", "cgroupfs"}, args...)...)
}

// images are the agent's image (make image's, from this package's agent)
// and the workload's: the agent's image with the reference data path's
// kvpath and runtime library under /ref and catatonit as /pause, a pod's
// namespace holder. The driver library (lib/libcuda.so.1) is mounted from
// the host at run time, as the NVIDIA container toolkit mounts libcuda: the
// agent then probes it at start (--lib), before any workload runs. Built once per test binary; podman's layer cache makes
// an unchanged rebuild cheap.
type images struct {
	agent, work, seccomp string
	// localhost is the seccomp profile for Kubernetes nodes (the
	// runtime spec's form, resolved for the agent's capabilities).
	localhost string
	// own is work with its own libcuda in the image: every container of
	// it maps the one file of that image layer.
	own string
}

var (
	imagesOnce sync.Once
	builtImgs  images
	imagesErr  error
)

func requirePodman(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatalf("podman is needed for the container end-to-end tests (.ci/run installs it): %v", err)
	}
}

func buildImages(t *testing.T) images {
	t.Helper()
	requirePodman(t)
	imagesOnce.Do(func() { builtImgs, imagesErr = build(testenv.RefDir(t)) })
	if imagesErr != nil {
		t.Fatal(imagesErr)
	}
	return builtImgs
}

func build(ref string) (images, error) {
	dir, err := os.MkdirTemp("", "lw-image-")
	if err != nil {
		return images{}, err
	}
	run := func(cmd *exec.Cmd) error {
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v\n%s", cmd.Args, err, out)
		}
		return nil
	}
	if err := run(exec.Command("bash", "../../scripts/image/podman-setup.sh")); err != nil {
		return images{}, err
	}
	bin := filepath.Join(dir, "agent")
	// go test puts its own GOROOT/bin first in PATH: this is the go that runs the test.
	gocmd := exec.Command("go", "build", "-o", bin, ".")
	if err := run(gocmd); err != nil {
		return images{}, err
	}
	img := images{agent: "localhost/lanewatch-agent:e2e", work: "localhost/lanewatch-refpath:e2e", seccomp: filepath.Join(dir, "image", "seccomp.json"),
		localhost: filepath.Join(dir, "image", "lanewatch.json")}
	if err := run(exec.Command("bash", "../../scripts/image/build.sh", bin, img.agent, filepath.Join(dir, "image"))); err != nil {
		return images{}, err
	}
	work := filepath.Join(dir, "work")
	for _, f := range []string{"bin/kvpath", "plain/libcudart.so.12"} {
		if err := copyFile(filepath.Join(ref, f), filepath.Join(work, "ref", f)); err != nil {
			return images{}, err
		}
	}
	if err := copyFile("/usr/bin/catatonit", filepath.Join(work, "pause")); err != nil {
		return images{}, fmt.Errorf("catatonit (podman's pause process) as the pod's PID 1: %w", err)
	}
	cf := filepath.Join(dir, "Containerfile.work")
	os.WriteFile(cf, []byte("FROM "+img.agent+"\nCOPY . /\nUSER 0:0\nENTRYPOINT []\n"), 0o644)
	if err := run(podman("build", "-q", "-f", cf, "-t", img.work, work)); err != nil {
		return images{}, err
	}
	own := filepath.Join(dir, "own")
	if err := copyFile(filepath.Join(ref, "lib", "libcuda.so.1"), filepath.Join(own, "ref", "lib", "libcuda.so.1")); err != nil {
		return images{}, err
	}
	img.own = "localhost/lanewatch-refpath-own:e2e"
	os.WriteFile(cf, []byte("FROM "+img.work+"\nCOPY . /\n"), 0o644)
	if err := run(podman("build", "-q", "-f", cf, "-t", img.own, own)); err != nil {
		return images{}, err
	}
	// Only the seccomp profiles are read from here on (podman holds the images).
	for _, p := range []string{bin, filepath.Join(dir, "image", "rootfs"), work, own} {
		os.RemoveAll(p)
	}
	return img, nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// container is a podman run in the background, removed at the test's end.
type container struct {
	name string
	cmd  *exec.Cmd
	log  *agentLog // its stderr
	out  io.ReadCloser
	in   io.WriteCloser
	done chan struct{} // closed once podman run returned, with err
	err  error
}

func startContainer(t *testing.T, name string, args ...string) *container {
	t.Helper()
	podman("rm", "-f", "-t", "0", name).Run()
	c := &container{name: name, cmd: podman(append([]string{"run", "--rm", "-i", "--name", name}, args...)...), done: make(chan struct{})}
	var err error
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if c.out, err = c.cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.log = newAgentLog(stderr)
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		podman("rm", "-f", "-t", "0", name).Run()
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			c.cmd.Process.Kill()
		}
	})
	return c
}

// wait waits (bounded) for the container to exit.
func (c *container) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-c.done:
		return c.err
	case <-time.After(d):
		t.Fatalf("container %s still running after %s:\n%s", c.name, d, c.log.String())
		return nil
	}
}

// stop sends SIGTERM (podman stop) and waits for the exit.
func (c *container) stop(t *testing.T) error {
	t.Helper()
	podman("stop", "-t", "30", c.name).Run()
	return c.wait(t, 40*time.Second)
}

// hostPID is the container's first process as the host sees it.
func (c *container) hostPID(t *testing.T) int {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, err := podman("inspect", "--format", "{{.State.Pid}}", c.name).Output()
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && pid > 0 {
			return pid
		}
	}
	t.Fatalf("container %s: no pid", c.name)
	return 0
}

// logShows waits until the container's log matches re.
func logShows(t *testing.T, l *agentLog, re *regexp.Regexp, d time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m := re.FindStringSubmatch(l.String()); m != nil {
			return m[len(m)-1]
		}
	}
	t.Fatalf("log did not show %q within %s:\n%s", re, d, l.String())
	return ""
}

// driverMount mounts the host's driver library directory where the
// workloads and the agent see it.
func driverMount(ref string) []string {
	return []string{"-v", filepath.Join(ref, "lib") + ":/ref/lib:ro"}
}

// agentArgs runs the image's agent as its non-root user with only caps
// (podman makes them ambient too, but the exec of the image's /agent, which
// has file capabilities, clears those: the agent holds its file capabilities
// within the bounding set, kept under no-new-privileges (so runc's
// init holds them permitted), a read-only root, the
// derived seccomp profile and the output directory at /out; it probes
// the driver library at start.
func agentArgs(img images, ref, out string, caps []string, extra ...string) []string {
	args := append([]string{"--security-opt", "seccomp=" + img.seccomp, "--security-opt", "no-new-privileges", "--read-only",
		"--cap-drop", "ALL", "--network", "host", "-v", out + ":/out"}, driverMount(ref)...)
	if len(caps) > 0 {
		args = append(args, "--cap-add", strings.Join(caps, ","))
	}
	args = append(args, extra...)
	return append(args, img.agent, "run", "--output", "/out/transfers.jsonl", "--lib", "/ref/lib/libcuda.so.1", "--web.listen-address", "127.0.0.1:0",
		"--otlp.grpc-listen", "", "--otlp.http-listen", "")
}

// outDir is a directory the agent's user (65532) and the workloads can write.
func outDir(t *testing.T) string {
	d := nobodyDir(t)
	os.Chmod(d, 0o777)
	return d
}

// held is a kvpath scenario stopped at its hold point (--hold): its
// libraries are mapped, no call made yet.
type held struct {
	pid int // as the agent sees it
	// nsPID is its pid as it sees itself (the truth's pid and tid): 0
	// when the agent sees the same.
	nsPID int
	in    io.WriteCloser
	truth string // on the host
	wait  func() error
}

func readyLine(t *testing.T, r io.Reader) {
	t.Helper()
	line, err := bufio.NewReader(r).ReadString('\n')
	if !strings.HasPrefix(line, "ready ") {
		t.Fatalf("kvpath did not stop at its hold point: %q %v", line, err)
	}
}

// inContainer starts hicache-load held in a workload container of image
// work (the driver library mounted from the host) or, with no ref, own.
func inContainer(t *testing.T, img images, ref, name, out string, podArgs ...string) (*held, *container) {
	t.Helper()
	truth := "truth-" + name + ".jsonl"
	image, mount := img.own, []string(nil)
	if ref != "" {
		image, mount = img.work, driverMount(ref)
	}
	args := append(append(append([]string{"-v", out + ":/out"}, mount...), podArgs...), image, "/ref/bin/kvpath", "--scenario", "hicache-load", "--hold", "--truth", "/out/"+truth)
	c := startContainer(t, name, args...)
	readyLine(t, c.out)
	go io.Copy(io.Discard, c.out)
	pid := c.hostPID(t)
	return &held{pid: pid, nsPID: nsPID(t, pid), in: c.in, truth: filepath.Join(out, truth), wait: func() error { return c.wait(t, 60*time.Second) }}, c
}

// onHost starts hicache-load held on the host.
func onHost(t *testing.T, ref, out string) *held {
	t.Helper()
	truth := filepath.Join(out, "truth-host.jsonl")
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "hicache-load", "--hold", "--truth", truth)
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	readyLine(t, stdout)
	go io.Copy(io.Discard, stdout)
	return &held{pid: cmd.Process.Pid, in: in, truth: truth, wait: cmd.Wait}
}

// readRecords reads the agent's JSONL records by pid.
func readRecords(t *testing.T, path string) map[uint32][]correlate.Transfer {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	by := map[uint32][]correlate.Transfer{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var tr correlate.Transfer
		if err := json.Unmarshal(sc.Bytes(), &tr); err != nil {
			t.Fatalf("%s: %v: %q", path, err, sc.Text())
		}
		by[tr.PID] = append(by[tr.PID], tr)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return by
}

// compareTruth says whether pid's records are exactly its scenario's
// truth; a difference fails unless the agent's summary counted ring losses
// (another package's load on a shared host can fill the ring).
func compareTruth(t *testing.T, what string, h *held, got []correlate.Transfer, agentLog string) int {
	t.Helper()
	truth, err := selftest.ReadTruthFile(h.truth)
	if err != nil {
		t.Fatal(err)
	}
	for i := range truth { // the scenario's threads, as the agent sees them
		if h.nsPID != 0 && truth[i].TID == uint32(h.nsPID) {
			truth[i].PID, truth[i].TID = uint32(h.pid), uint32(h.pid)
		}
	}
	res := selftest.Result{Scenario: "hicache-load", PID: uint32(h.pid)}
	selftest.Compare(&res, truth, got)
	t.Logf("%s (pid %d): %d of %d records, %d of %d bytes, problems %v", what, h.pid, res.Got, res.WantRecords, res.GotBytes, res.WantBytes, res.Problems)
	if !res.OK() || res.WantRecords == 0 {
		if m := regexp.MustCompile(`msg=summary .* ring_full=([1-9]\d*)`).FindStringSubmatch(agentLog); m != nil && res.Got > 0 {
			t.Logf("%s: not exact, with %s ring losses counted by the agent (a busy host)", what, m[1])
			return res.Got
		}
		t.Errorf("%s: records differ from the truth: %+v\nagent log:\n%s", what, res, agentLog)
	}
	return res.Got
}

// scrape reads the agent's metrics from the host and sums a counter.
func scrapeSum(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	if f := fams[name]; f != nil {
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var (
	servingRE = regexp.MustCompile(`msg="serving metrics" address=(127\.0\.0\.1:\d+)`)
	runningRE = regexp.MustCompile(`msg="lanewatch running`)
)

// The node-agent shape: the image's agent, as its non-root user with only
// its capabilities and the host's PID namespace, traces hicache-load in a
// second container and on the host; each process's records are exactly its
// truth (the container exits while traced: nothing of it is lost), the
// metrics and health endpoints answer on the host.
func TestContainerHostPID(t *testing.T) {
	img := buildImages(t)
	ref := testenv.RefDir(t)
	out := outDir(t)
	tag := strconv.Itoa(os.Getpid())

	agent := startContainer(t, "lw-e2e-agent-"+tag, agentArgs(img, ref, out, imageCaps, "--pid", "host")...)
	addr := logShows(t, agent.log, servingRE, 60*time.Second)
	logShows(t, agent.log, runningRE, 60*time.Second)
	// Every thread holds the five, from the image's file capabilities.
	threads := threadCaps(t, agent.hostPID(t))
	if want := "CapPrm=1c000080004 CapEff=1c000080004 CapAmb="; len(threads) != 1 || threads[want] == 0 {
		t.Errorf("the agent's threads by capability sets: %v, want all %q", threads, want)
	}
	t.Logf("the agent's threads by capability sets: %v", threads)
	if code, body := get(t, "http://"+addr+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz from the host: %d %q", code, body)
	}

	w, _ := inContainer(t, img, ref, "lw-e2e-work-"+tag, out)
	h := onHost(t, ref, out)
	for _, p := range []*held{w, h} {
		p.in.Close()
	}
	for _, p := range []*held{w, h} {
		if err := p.wait(); err != nil {
			t.Fatalf("kvpath pid %d: %v", p.pid, err)
		}
	}
	// Counters only grow; other processes on the host may add to them.
	var sum float64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if sum = scrapeSum(t, addr, "lanewatch_transfers_total"); sum >= 64 {
			break
		}
	}
	if sum < 64 {
		t.Errorf("lanewatch_transfers_total scraped from the host: %g, want at least 64", sum)
	}
	code, body := get(t, "http://"+addr+"/readyz")
	t.Logf("/readyz: %d %q", code, body)
	if code != 200 && (code != 503 || !strings.HasPrefix(body, "not ready:\n- ")) {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if err := agent.stop(t); err != nil {
		t.Errorf("agent: %v\n%s", err, agent.log.String())
	}
	log := agent.log.String()
	if strings.Contains(log, "missing CAP_") {
		t.Errorf("a capability named missing:\n%s", log)
	}
	recs := readRecords(t, filepath.Join(out, "transfers.jsonl"))
	n := compareTruth(t, "in a second container", w, recs[uint32(w.pid)], log)
	n += compareTruth(t, "on the host", h, recs[uint32(h.pid)], log)
	t.Logf("records matched: %d", n)
}

// The sidecar shape: a pod's PID namespace held by a pause process, the
// workload and the agent in two containers sharing it (`--pid
// container:NAME`, Kubernetes' shareProcessNamespace). The agent knows the
// workload by its pid there. Its seccomp profile is the one for Kubernetes
// nodes (bin/image/lanewatch.json): no rule conditional on capabilities
// left, bpf, perf_event_open and move_pages allowed.
func TestContainerSidecar(t *testing.T) {
	img := buildImages(t)
	checkLocalhostProfile(t, img.localhost)
	img.seccomp = img.localhost
	ref := testenv.RefDir(t)
	out := outDir(t)
	tag := strconv.Itoa(os.Getpid())
	pod := "lw-e2e-pod-" + tag
	holder := startContainer(t, pod, img.work, "/pause", "-P")
	// `podman run` returns before the container exists: the containers
	// joining its PID namespace start once it runs, or podman finds none.
	holder.hostPID(t)
	agent := startContainer(t, "lw-e2e-sidecar-"+tag, agentArgs(img, ref, out, imageCaps, "--pid", "container:"+pod)...)
	logShows(t, agent.log, runningRE, 60*time.Second)
	logShows(t, agent.log, regexp.MustCompile(`msg="in a PID namespace of its own`), time.Second)

	w, wc := inContainer(t, img, ref, "lw-e2e-sidework-"+tag, out, "--pid", "container:"+pod)
	w.pid, w.nsPID = nsPID(t, wc.hostPID(t)), 0 // the agent shares its namespace
	w.in.Close()
	if err := w.wait(); err != nil {
		t.Fatalf("kvpath: %v", err)
	}
	if err := agent.stop(t); err != nil {
		t.Errorf("agent: %v\n%s", err, agent.log.String())
	}
	recs := readRecords(t, filepath.Join(out, "transfers.jsonl"))
	n := compareTruth(t, "sidecar", w, recs[uint32(w.pid)], agent.log.String())
	for pid := range recs {
		if pid != uint32(w.pid) {
			t.Errorf("records of pid %d, outside the pod (only %d runs CUDA in it)", pid, w.pid)
		}
	}
	t.Logf("records matched: %d", n)
}

// nsPID is a host pid's pid in its own (innermost) PID namespace, the last
// field of /proc/PID/status's NSpid line.
func nsPID(t *testing.T, hostPID int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", hostPID))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" {
			if pid, err := strconv.Atoi(f[len(f)-1]); err == nil {
				return pid
			}
		}
	}
	t.Fatalf("/proc/%d/status: no NSpid", hostPID)
	return 0
}

// Each capability of the image's set removed in turn: CAP_BPF or
// CAP_PERFMON missing stops the agent (exit 1) naming it and what needs it;
// any other missing is named with what is then not done, and the agent runs.
func TestContainerEachCapability(t *testing.T) {
	img := buildImages(t)
	ref := testenv.RefDir(t)
	out := outDir(t)
	tag := strconv.Itoa(os.Getpid())
	for _, drop := range imageCaps {
		var caps []string
		for _, c := range imageCaps {
			if c != drop {
				caps = append(caps, c)
			}
		}
		a := startContainer(t, "lw-e2e-caps-"+strings.ToLower(drop)+"-"+tag, agentArgs(img, ref, out, caps, "--pid", "host")...)
		fatal := drop == "BPF" || drop == "PERFMON"
		var line string
		if fatal {
			err := a.wait(t, 60*time.Second)
			ee, ok := err.(*exec.ExitError)
			line = logShows(t, a.log, regexp.MustCompile(`(agent run: missing CAP_`+drop+` to [^\n]*)`), time.Second)
			if !ok || ee.ExitCode() != 1 {
				t.Errorf("without CAP_%s: exit %v, want 1:\n%s", drop, err, a.log.String())
			}
			if strings.Contains(strings.ToLower(a.log.String()), "memlock") {
				t.Errorf("without CAP_%s: blames the memlock limit:\n%s", drop, a.log.String())
			}
		} else {
			line = logShows(t, a.log, regexp.MustCompile(`(msg="missing CAP_`+drop+`" needed="[^"]+")`), 60*time.Second)
			logShows(t, a.log, runningRE, 60*time.Second)
			if err := a.stop(t); err != nil {
				t.Errorf("without CAP_%s: agent: %v\n%s", drop, err, a.log.String())
			}
		}
		if others := regexp.MustCompile(`missing (CAP_\w+)`).FindAllStringSubmatch(a.log.String(), -1); len(others) != 1 {
			t.Errorf("without CAP_%s: %d capabilities named missing, want 1:\n%s", drop, len(others), a.log.String())
		}
		t.Logf("without CAP_%s: %s", drop, line)
	}
}

// Two containers of one image whose layer holds libcuda: overlayfs shows
// its file with another device in each, the kernel probes the one real
// inode. The agent attaches it once (probes.Fingerprint); attached once per
// container every probe fired twice, and the second return of each call
// found no entry (lost_return, the process marked lossy).
func TestContainerSameImage(t *testing.T) {
	img := buildImages(t)
	ref := testenv.RefDir(t)
	out := outDir(t)
	tag := strconv.Itoa(os.Getpid())
	agent := startContainer(t, "lw-e2e-same-"+tag, agentArgs(img, ref, out, imageCaps, "--pid", "host")...)
	logShows(t, agent.log, runningRE, 60*time.Second)
	w1, _ := inContainer(t, img, "", "lw-e2e-same1-"+tag, out)
	w2, _ := inContainer(t, img, "", "lw-e2e-same2-"+tag, out)
	ownAttach := regexp.MustCompile(`msg=attached path=/ref/lib/libcuda\.so\.1 .* via=map_files`) // not --lib's host file
	// Each container's libcuda attached, or found probed already.
	seen := regexp.MustCompile(`msg=(attached|"probed already[^"]*") path=/ref/lib/libcuda\.so\.1 .*(via=map_files|pid=\d+)`)
	for deadline := time.Now().Add(30 * time.Second); len(seen.FindAllString(agent.log.String(), -1)) < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("both containers' libcuda not seen within 30s:\n%s", agent.log.String())
		}
	}
	for _, w := range []*held{w1, w2} {
		w.in.Close()
	}
	for _, w := range []*held{w1, w2} {
		if err := w.wait(); err != nil {
			t.Fatalf("kvpath: %v", err)
		}
	}
	if err := agent.stop(t); err != nil {
		t.Errorf("agent: %v\n%s", err, agent.log.String())
	}
	log := agent.log.String()
	if n := len(ownAttach.FindAllString(log, -1)); n != 1 {
		t.Errorf("the image layer's libcuda attached %d times, want once:\n%s", n, log)
	}
	recs := readRecords(t, filepath.Join(out, "transfers.jsonl"))
	for _, w := range []*held{w1, w2} {
		pageable := 0
		for _, r := range recs[uint32(w.pid)] {
			if r.HostMem == event.MemPageable {
				pageable++
			}
		}
		if n := len(recs[uint32(w.pid)]); n != 32 || pageable > 0 {
			t.Errorf("pid %d: %d records (want hicache-load's 32), %d of them pageable (its pools are pinned)", w.pid, n, pageable)
		}
	}
}

// checkLocalhostProfile: the profile is in the runtime spec's form
// (containerd reads a Localhost profile as one), with no rule conditional
// on capabilities, and allows what the agent needs.
func checkLocalhostProfile(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		DefaultAction string   `json:"defaultAction"`
		Architectures []string `json:"architectures"`
		Syscalls      []map[string]any
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	allowed := map[string]bool{}
	for _, r := range p.Syscalls {
		for k := range r {
			if k != "names" && k != "action" && k != "args" && k != "errnoRet" {
				t.Errorf("%s: rule %v has %q: not the runtime spec's form", path, r["names"], k)
			}
		}
		if r["action"] == "SCMP_ACT_ALLOW" && r["args"] == nil {
			for _, n := range r["names"].([]any) {
				allowed[n.(string)] = true
			}
		}
	}
	if p.DefaultAction == "" || !slices.Contains(p.Architectures, "SCMP_ARCH_X86_64") {
		t.Errorf("%s: defaultAction %q architectures %v", path, p.DefaultAction, p.Architectures)
	}
	for _, n := range []string{"bpf", "perf_event_open", "move_pages"} {
		if !allowed[n] {
			t.Errorf("%s: %s not allowed", path, n)
		}
	}
}
