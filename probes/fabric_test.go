package probes

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// A program on the real libfabric (Debian's libfabric1): it opens an RDM
// endpoint of the tcp provider (rxm over tcp, what fi_pingpong -p tcp -e
// rdm gets) and prints, from the system headers, the offsets the agent
// assumes, the objects, and the functions the inline calls (fi_domain,
// fi_send, fi_cq_read, ...) reach through their ops.
const fabricMain = `
#include <stdio.h>
#include <stddef.h>
#include <string.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_eq.h>
#define O(s, f) (unsigned long)offsetof(struct s, f)
int main(void) {
	struct fi_info *hints = fi_allocinfo(), *info;
	struct fid_fabric *fabric; struct fid_domain *domain; struct fid_ep *ep; struct fid_cq *cq;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED | FI_RMA;
	hints->mode = FI_CONTEXT;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup("tcp");
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE};
	if (fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", NULL, 0, hints, &info) || fi_fabric(info->fabric_attr, &fabric, NULL) ||
	    fi_domain(fabric, info, &domain, NULL) || fi_endpoint(domain, info, &ep, NULL) || fi_cq_open(domain, &cq_attr, &cq, NULL)) {
		printf("setup failed\n");
		return 1;
	}
	printf("%lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu\n",
	       O(fid, fclass), O(fid, ops), O(fi_ops, bind), O(fid_fabric, ops), O(fi_ops_fabric, domain), O(fid_domain, ops),
	       O(fi_ops_domain, cq_open), O(fi_ops_domain, endpoint), O(fid_ep, msg), O(fid_ep, rma), O(fid_ep, tagged),
	       O(fi_ops_msg, send), O(fi_ops_msg, inject), O(fi_ops_msg, senddata), O(fi_ops_rma, read), O(fi_ops_rma, write),
	       O(fi_ops_rma, inject), O(fi_ops_rma, writedata), O(fid_cq, ops), O(fi_ops_cq, read), O(fi_info, domain_attr),
	       O(fi_info, fabric_attr), O(fi_fabric_attr, prov_name), O(fi_domain_attr, name),
	       O(fi_ops_msg, sendmsg), O(fi_ops_tagged, sendmsg), O(fi_ops_rma, writemsg), O(fi_ops_rma, readmsg),
	       (unsigned long)FI_CLASS_FABRIC, (unsigned long)FI_CLASS_DOMAIN, (unsigned long)FI_CLASS_EP, (unsigned long)FI_CLASS_CQ,
	       (unsigned long)FI_TRANSMIT);
	printf("%p %p %p %p %p\n", (void *)fabric, (void *)domain, (void *)ep, (void *)cq, (void *)info);
	printf("%p %p %p %p %p %p %p %p %p %p %p %p %p %p %p %p %p %p\n", (void *)fabric->ops->domain, (void *)domain->ops->endpoint,
	       (void *)domain->ops->cq_open, (void *)ep->fid.ops->bind, (void *)ep->msg->send, (void *)ep->msg->senddata,
	       (void *)ep->msg->inject, (void *)ep->tagged->send, (void *)ep->tagged->inject, (void *)ep->rma->write,
	       (void *)ep->rma->writedata, (void *)ep->rma->inject, (void *)ep->rma->read, (void *)cq->ops->read,
	       (void *)ep->msg->sendmsg, (void *)ep->tagged->sendmsg, (void *)ep->rma->writemsg, (void *)ep->rma->readmsg);
	printf("%s %s\n", info->fabric_attr->prov_name, info->domain_attr->name);
	fflush(stdout);
	getchar();
	return 0;
}
`

// fabricRowsOrder is the order the program prints its functions in.
var fabricRowsOrder = []string{FabricRowDomain, FabricRowEndpoint, FabricRowCQOpen, "provider:fi_ep_bind",
	"provider:fi_send", "provider:fi_senddata", "provider:fi_inject", "provider:fi_tsend", "provider:fi_tinject",
	"provider:fi_write", "provider:fi_writedata", "provider:fi_inject_write", "provider:fi_read", "provider:fi_cq_read",
	"provider:fi_sendmsg", "provider:fi_tsendmsg", "provider:fi_writemsg", "provider:fi_readmsg"}

type fabricProgram struct {
	pid                          int
	fabric, domain, ep, cq, info uint64
	fns                          map[string]uint64
	provider, domainName         string
}

func startFabricProgram(t *testing.T) fabricProgram {
	t.Helper()
	if _, err := os.Stat("/usr/include/rdma/fabric.h"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("libfabric-dev is missing (rdma/fabric.h)")
		}
		t.Skip("libfabric-dev is missing")
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "main.c"), filepath.Join(dir, "fab")
	os.WriteFile(src, []byte(fabricMain), 0o644)
	if out, err := exec.Command("gcc", "-O2", "-o", bin, src, "-lfabric").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	rd := bufio.NewReader(stdout)
	var lines [4][]string
	for i := range lines {
		line, err := rd.ReadString('\n')
		if err != nil || strings.HasPrefix(line, "setup failed") {
			t.Fatalf("the libfabric program: %q %v", line, err)
		}
		lines[i] = strings.Fields(line)
	}
	nums := func(f []string, n int) []uint64 {
		if len(f) != n {
			t.Fatalf("%d fields, want %d: %q", len(f), n, f)
		}
		var out []uint64
		for _, s := range f {
			v, err := strconv.ParseUint(s, 0, 64)
			if err != nil {
				t.Fatalf("%q: %v", s, err)
			}
			out = append(out, v)
		}
		return out
	}
	// The offsets and constants the agent assumes, as the headers say.
	assumed := []uint64{fidClass, fidOps, fiOpsBind, fabricOps, fabricOpsDomain, domainOps, domainOpsCQOpen, domainOpsEndpoint,
		epMsg, epRMA, epTagged, msgSend, msgInject, msgSendData, rmaRead, rmaWrite, rmaInject, rmaWriteData, cqOps, cqOpsRead,
		infoDomainAttr, infoFabricAttr, fabricAttrProv, domainAttrName, msgSendMsg, msgSendMsg, rmaWriteMsg, rmaReadMsg,
		fiClassFabric, fiClassDomain, fiClassEP, fiClassCQ, FITransmit}
	if got := nums(lines[0], len(assumed)); !slicesEqual(got, assumed) {
		t.Fatalf("libfabric's headers say %v, the agent assumes %v", got, assumed)
	}
	obj := nums(lines[1], 5)
	p := fabricProgram{pid: cmd.Process.Pid, fabric: obj[0], domain: obj[1], ep: obj[2], cq: obj[3], info: obj[4], fns: map[string]uint64{}}
	for i, v := range nums(lines[2], len(fabricRowsOrder)) {
		p.fns[fabricRowsOrder[i]] = v
	}
	if len(lines[3]) != 2 {
		t.Fatalf("names %q", lines[3])
	}
	p.provider, p.domainName = lines[3][0], lines[3][1]
	return p
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Read out of the process, each stage's ops name exactly the functions the
// program's own inline calls reach, each located in the stripped
// libfabric.so at a function start; the names are the fi_info's.
func TestResolveFabricOps(t *testing.T) {
	testenv.RequireRoot(t) // /proc/PID/mem of another process
	p := startFabricProgram(t)
	got := map[string]ProviderFunc{}
	for _, st := range []struct {
		row string
		obj uint64
	}{{"fi_fabric", p.fabric}, {FabricRowDomain, p.domain}, {FabricRowEndpoint, p.ep}, {FabricRowCQOpen, p.cq}} {
		fns, err := ResolveFabricOps("/proc", p.pid, st.row, st.obj)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fns {
			got[f.Row] = f
		}
	}
	if len(got) != len(FabricRows()) {
		t.Errorf("resolved %d rows, want every one of %v", len(got), FabricRows())
	}
	for _, row := range FabricRows() {
		f, ok := got[row]
		switch {
		case !ok:
			t.Errorf("%s not resolved", row)
		case f.Addr != p.fns[row]:
			t.Errorf("%s: resolved %#x, the program's call reaches %#x", row, f.Addr, p.fns[row])
		case !strings.Contains(filepath.Base(f.Path), "libfabric.so"):
			t.Errorf("%s: in %s, want libfabric", row, f.Path)
		default:
			if _, ok := Template(row); !ok {
				t.Errorf("%s resolved but is no table row", row)
			}
			t.Logf("%-28s %s+%#x", row, filepath.Base(f.Path), f.FileOffset)
		}
	}
	prov, dom, err := FabricNames("/proc", p.pid, p.info)
	if err != nil || prov != p.provider || dom != p.domainName || prov != "tcp;ofi_rxm" {
		t.Errorf("names %q %q %v, the program says %q %q (fi_pingpong -p tcp -e rdm gets tcp;ofi_rxm)", prov, dom, err, p.provider, p.domainName)
	}
}

// An object of another class than the row returns, or a fi_info that is
// not one, is refused naming what it read; nothing is resolved.
func TestResolveFabricOpsRefuses(t *testing.T) {
	testenv.RequireRoot(t)
	p := startFabricProgram(t)
	if _, err := ResolveFabricOps("/proc", p.pid, FabricRowEndpoint, p.fabric); err == nil || !strings.Contains(err.Error(), "class 1, want 3") {
		t.Errorf("a fabric taken for an endpoint: %v", err)
	}
	if _, err := ResolveFabricOps("/proc", p.pid, "provider:fi_send", p.ep); err == nil {
		t.Error("a row that returns no object resolved")
	}
	if _, _, err := FabricNames("/proc", p.pid, p.cq); err == nil {
		t.Error("a CQ read as a fi_info gave names")
	}
}

// A layered provider's CQ read reaches its core's through the same
// function (rxm over tcp: util's cq_read, FABRIC-RESEARCH §4). Here rd
// calls itself through a pointer, three deep, then once alone: the
// fabric slot reports the outermost call of each (its arguments, its
// result, the context read at return) and nothing of the nested ones, and
// no return goes without its entry (enum lw_slot).
const nestLib = `
typedef long (*rd_fn)(void *cq, long *buf, long depth);
static long rd(void *cq, long *buf, long depth);
static volatile rd_fn core = rd;
static long rd(void *cq, long *buf, long depth) {
	long n = depth > 0 ? core((char *)cq + 0x100, buf + 1, depth - 1) : 0;
	return n + 1;
}
__attribute__((visibility("default"))) long app_read(void *cq, long *buf, long depth) { return core(cq, buf, depth); }
`

const nestMain = `
#include <stdio.h>
long app_read(void *cq, long *buf, long depth);
int main(void) {
	long buf[8] = {0xc0ffee, 1, 2, 3};
	getchar();
	printf("%ld\n", app_read((void *)0x1000, buf, 3) + app_read((void *)0x2000, buf + 1, 0));
	fflush(stdout);
	getchar();
	return 0;
}
`

func TestFabricSlotNests(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	lib, bin := filepath.Join(dir, "libnest.so"), filepath.Join(dir, "nest")
	os.WriteFile(filepath.Join(dir, "lib.c"), []byte(nestLib), 0o644)
	os.WriteFile(filepath.Join(dir, "main.c"), []byte(nestMain), 0o644)
	for _, args := range [][]string{
		{"gcc", "-O1", "-fPIC", "-shared", "-fno-optimize-sibling-calls", "-o", lib, filepath.Join(dir, "lib.c")},
		{"gcc", "-O1", "-o", bin, filepath.Join(dir, "main.c"), "-L" + dir, "-lnest", "-Wl,-rpath," + dir},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	syms, err := LookupSymbols(lib, []string{"rd"})
	if err != nil || len(syms) != 1 {
		t.Fatalf("rd in %s: %v %v", lib, syms, err)
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	var id FileID
	for deadline := time.Now().Add(10 * time.Second); id == (FileID{}); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the program never mapped its library")
		}
		maps, _ := ReadMaps("/proc", cmd.Process.Pid)
		for _, m := range maps {
			if m.Path == lib && m.Executable() {
				id, _ = m.FileID()
			}
		}
	}
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const row = "provider:fi_cq_read"
	if _, err := p.AttachFile(id, lib, map[string]Symbol{row: {Name: row, Offset: syms["rd"].Offset}}, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	stop := collect(t, p)
	fmt.Fprintln(stdin)
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || strings.TrimSpace(line) != "5" {
		t.Fatalf("the program returned %q, %v", line, err)
	}
	var got []event.Call
	for _, c := range stop() {
		if c.PID == uint32(cmd.Process.Pid) {
			got = append(got, c)
		}
	}
	if len(got) != 2 {
		t.Fatalf("%d events, want the two outermost reads: %+v", len(got), got)
	}
	for i, w := range []struct{ cq, ret, ctx uint64 }{{0x1000, 4, 0xc0ffee}, {0x2000, 1, 1}} {
		if c := got[i]; c.Symbol != row || c.Ptr != w.cq || c.Ret != w.ret || c.Handle != w.ctx || c.LostBefore {
			t.Errorf("read %d: cq %#x ret %d context %#x lost %v, want cq %#x ret %d context %#x", i, c.Ptr, c.Ret, c.Handle, c.LostBefore, w.cq, w.ret, w.ctx)
		}
	}
	if d, err := p.Drops(); err != nil || d.NoEntry != 0 {
		t.Errorf("drops %+v %v: no return may go without its entry", d, err)
	}
}

// The msg forms' entry reads the message as libfabric's headers lay it
// out: a library of static functions with the providers' signatures,
// attached as the four rows, called with real structs (two iovecs; five,
// more than the probe sums).
const msgLib = `
#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
static ssize_t sm(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags) { return msg->iov_count; }
static ssize_t tsm(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags) { return msg->iov_count; }
static ssize_t wm(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags) { return msg->iov_count; }
static ssize_t rm(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags) { return msg->iov_count; }
static struct fi_ops_msg msg_ops = {.size = sizeof(struct fi_ops_msg), .sendmsg = sm};
static struct fi_ops_tagged tagged_ops = {.size = sizeof(struct fi_ops_tagged), .sendmsg = tsm};
static struct fi_ops_rma rma_ops = {.size = sizeof(struct fi_ops_rma), .writemsg = wm, .readmsg = rm};
__attribute__((visibility("default"))) void open_ep(struct fid_ep *ep) { ep->msg = &msg_ops; ep->tagged = &tagged_ops; ep->rma = &rma_ops; }
`

const msgMain = `
#include <stdio.h>
#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
void open_ep(struct fid_ep *ep);
int main(void) {
	static char buf[8192];
	struct fid_ep ep = {0};
	open_ep(&ep);
	struct iovec iov[5] = {{buf, 4096}, {buf + 4096, 100}, {buf, 1}, {buf, 1}, {buf, 1}};
	struct fi_rma_iov rma = {.addr = 0x7f0000001000, .len = 4196, .key = 7};
	struct fi_msg m = {.msg_iov = iov, .iov_count = 2, .addr = 3, .context = (void *)0xc1};
	struct fi_msg_tagged tm = {.msg_iov = iov, .iov_count = 2, .addr = 3, .tag = 0x99, .context = (void *)0xc2};
	struct fi_msg_rma wm = {.msg_iov = iov, .iov_count = 2, .addr = 3, .rma_iov = &rma, .rma_iov_count = 1, .context = (void *)0xc3};
	struct fi_msg_rma many = wm;
	many.iov_count = 5;
	printf("%p\n", (void *)buf);
	fflush(stdout);
	getchar();
	printf("%ld\n", (long)(fi_sendmsg(&ep, &m, 0) + fi_tsendmsg(&ep, &tm, 0) + fi_writemsg(&ep, &wm, 0) +
			       fi_readmsg(&ep, &wm, 0) + fi_writemsg(&ep, &many, 0)));
	fflush(stdout);
	getchar();
	return 0;
}
`

func TestFabricMsgDecode(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := os.Stat("/usr/include/rdma/fabric.h"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("libfabric-dev is missing (rdma/fabric.h)")
		}
		t.Skip("libfabric-dev is missing")
	}
	dir := t.TempDir()
	lib, bin := filepath.Join(dir, "libmsg.so"), filepath.Join(dir, "msg")
	os.WriteFile(filepath.Join(dir, "lib.c"), []byte(msgLib), 0o644)
	os.WriteFile(filepath.Join(dir, "main.c"), []byte(msgMain), 0o644)
	for _, args := range [][]string{
		{"gcc", "-O1", "-fPIC", "-shared", "-o", lib, filepath.Join(dir, "lib.c")},
		{"gcc", "-O1", "-o", bin, filepath.Join(dir, "main.c"), "-L" + dir, "-lmsg", "-Wl,-rpath," + dir},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	names := map[string]string{"sm": "provider:fi_sendmsg", "tsm": "provider:fi_tsendmsg", "wm": "provider:fi_writemsg", "rm": "provider:fi_readmsg"}
	local, err := LookupSymbols(lib, []string{"sm", "tsm", "wm", "rm"})
	if err != nil || len(local) != 4 {
		t.Fatalf("functions in %s: %v %v", lib, local, err)
	}
	syms := map[string]Symbol{}
	for fn, row := range names {
		syms[row] = Symbol{Name: row, Offset: local[fn].Offset}
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	buf, err := strconv.ParseUint(strings.TrimSpace(line), 0, 64)
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	var id FileID
	maps, _ := ReadMaps("/proc", cmd.Process.Pid)
	for _, m := range maps {
		if m.Path == lib && m.Executable() {
			id, _ = m.FileID()
		}
	}
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.AttachFile(id, lib, syms, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	stop := collect(t, p)
	fmt.Fprintln(stdin)
	if line, err := out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "13" {
		t.Fatalf("the program returned %q, %v", line, err)
	}
	var got []event.Call
	for _, c := range stop() {
		if c.PID == uint32(cmd.Process.Pid) {
			got = append(got, c)
		}
	}
	const remote, many = 0x7f0000001000, ^uint64(0)
	want := []struct {
		row                       string
		bytes, src, dst, ctx, ret uint64
	}{
		{"provider:fi_sendmsg", 4196, buf, 0, 0xc1, 2},
		{"provider:fi_tsendmsg", 4196, buf, 0, 0xc2, 2},
		{"provider:fi_writemsg", 4196, buf, remote, 0xc3, 2},
		{"provider:fi_readmsg", 4196, remote, buf, 0xc3, 2},
		{"provider:fi_writemsg", many, buf, remote, 0xc3, 5},
	}
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		c := got[i]
		if c.Symbol != w.row || c.Bytes != w.bytes || c.Src != w.src || c.Dst != w.dst || c.Handle != w.ctx || c.Ret != w.ret || c.Ptr == 0 {
			t.Errorf("event %d: %s bytes %d src %#x dst %#x context %#x ret %d ep %#x; want %+v", i, c.Symbol, c.Bytes, c.Src, c.Dst, c.Handle, c.Ret, c.Ptr, w)
		}
	}
}
