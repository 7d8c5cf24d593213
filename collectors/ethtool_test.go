package collectors

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safchain/ethtool"
	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

func readEthtoolSample(t *testing.T, file string) map[string]uint64 {
	t.Helper()
	path := filepath.Join("testdata", "ethtool", file)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := ParseEthtoolStats(f, path)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestParseEthtoolStatsSamples(t *testing.T) {
	tests := []struct {
		file string
		n    int
		spot map[string]uint64
	}{
		// byteps#179 `ethtool -S enp178s0f0 | grep prio`: all traffic on prio 0
		{"byteps-issue-179_mlx5_enp178s0f0_grep_prio_before_2to1.txt", 32,
			map[string]uint64{"rx_prio0_bytes": 88178050405854, "rx_prio0_packets": 420006709813,
				"tx_prio0_bytes": 14056302074308, "tx_prio0_packets": 40316741528, "rx_prio3_bytes": 0, "tx_prio7_packets": 0}},
		// ethq mlx5 Ubuntu 16.04 driver: older names (pause_ctrl_rx), no prio counters
		{"ethq_mlx5_core_CX4_ubuntu1604_early.txt", 309,
			map[string]uint64{"rx_packets": 5487361, "rx_bytes": 1063043816, "tx_packets": 5116718, "tx_bytes": 5813725708,
				"rx_multicast_packets": 966381, "tx_broadcast_bytes": 60}},
		// ethq mlx5 Ubuntu 18.04, kernel 4.15, fw 14.23: the full layout
		{"ethq_mlx5_core_CX4_ubuntu1804_k4.15_fw14.23_stripped.txt", 751,
			map[string]uint64{"rx_packets": 845320277, "rx_bytes": 2195783498134, "tx_packets": 896117891,
				"tx_bytes": 2655285206479, "rx_bytes_phy": 2202570777997, "rx_out_of_buffer": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			st := readEthtoolSample(t, tt.file)
			if len(st) != tt.n {
				t.Errorf("%d statistics, want %d", len(st), tt.n)
			}
			for k, v := range tt.spot {
				if g, ok := st[k]; !ok || g != v {
					t.Errorf("%s = %d, %v; want %d", k, g, ok, v)
				}
			}
		})
	}
}

func TestReadEthtoolStatsBadName(t *testing.T) {
	for _, n := range []string{"", "a-name-of-16-ch", "x/y", "a b"} {
		if len(n) == 15 {
			n += "x" // 16 bytes: would not fit the kernel's IFNAMSIZ with its NUL
		}
		if _, err := ReadEthtoolStats(n); err == nil {
			t.Errorf("%q: no error", n)
		}
	}
	if _, err := ReadEthtoolStats("lw-no-such-if"); err == nil || !strings.Contains(err.Error(), "lw-no-such-if") {
		t.Errorf("missing interface: %v", err)
	}
}

// vethNS is a network namespace made by the test, holding a veth pair
// lwa <-> lwb. Nothing in it is connected to any other namespace.
type vethNS struct{ name string }

var vethSeq atomic.Int32

func newVethNS(t *testing.T) vethNS {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("the veth test needs iproute2's ip: ", err)
	}
	ns := vethNS{fmt.Sprintf("lwtest-%d-%d", os.Getpid(), vethSeq.Add(1))}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// deleting the namespace destroys the veth pair in it too
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns.name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", ns.name, err, out)
		}
	})
	ip("netns", "add", ns.name)
	ip("-n", ns.name, "link", "add", "name", "lwa", "type", "veth", "peer", "name", "lwb")
	// veth counts received packets in rx_queue_0_* only on its NAPI path:
	// GRO on the receiver, and TSO off on the sender so that its frames are
	// eligible (drivers/net/veth.c veth_skb_is_eligible_for_gro).
	if err := ns.do(func() error {
		e, err := ethtool.NewEthtool()
		if err != nil {
			return err
		}
		defer e.Close()
		if err := e.Change("lwb", map[string]bool{"rx-gro": true}); err != nil {
			return fmt.Errorf("lwb rx-gro on: %w", err)
		}
		names, err := e.FeatureNames("lwa")
		if err != nil {
			return err
		}
		off := map[string]bool{}
		for n := range names {
			if strings.HasPrefix(n, "tx-tcp") && strings.HasSuffix(n, "segmentation") {
				off[n] = false
			}
		}
		if err := e.Change("lwa", off); err != nil {
			return fmt.Errorf("lwa tso off: %w", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ip("-n", ns.name, "link", "set", "lwa", "up")
	ip("-n", ns.name, "link", "set", "lwb", "up")
	return ns
}

// do runs fn on a thread that has entered the namespace. The thread stays
// locked and dies with its goroutine, so no other goroutine ever runs in
// the test namespace. fn must not start goroutines of its own.
func (ns vethNS) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		f, err := os.Open(filepath.Join("/run/netns", ns.name))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns.name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// sendFrames sends n broadcast frames of the IEEE local experimental
// ethertype 0x88B5 out of lwa, so they arrive on lwb. Raw Ethernet, no IP
// address anywhere: the frames cannot leave the namespace.
func (ns vethNS) sendFrames(n int) error {
	return ns.do(func() error {
		ifc, err := net.InterfaceByName("lwa")
		if err != nil {
			return err
		}
		const proto = 0x88B5
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		defer unix.Close(fd)
		dst := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		frame := make([]byte, 60)
		copy(frame, dst[:6])
		copy(frame[6:], ifc.HardwareAddr)
		frame[12], frame[13] = proto>>8, proto&0xff
		sa := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Protocol: proto>>8 | (proto&0xff)<<8, Halen: 6, Addr: dst}
		for range n {
			if err := unix.Sendto(fd, frame, 0, sa); err != nil {
				return fmt.Errorf("sendto lwa: %w", err)
			}
		}
		return nil
	})
}

func (ns vethNS) stats(ifname string) (map[string]uint64, error) {
	var st map[string]uint64
	err := ns.do(func() (err error) {
		st, err = ReadEthtoolStats(ifname)
		return err
	})
	return st, err
}

// TestReadEthtoolStatsVeth reads real driver statistics through the ioctl
// path from a veth pair in a namespace of the test's own, before and after
// sending frames between its ends.
func TestReadEthtoolStatsVeth(t *testing.T) {
	ns := newVethNS(t)
	before, err := ns.stats("lwb")
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ns.stats("lwa")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"peer_ifindex", "rx_queue_0_xdp_packets", "rx_queue_0_xdp_bytes", "rx_queue_0_drops",
		"tx_queue_0_xdp_xmit"} {
		if _, ok := before[k]; !ok {
			t.Errorf("veth statistic %s missing: %v", k, before)
		}
	}
	// each end names the other as its peer
	if before["peer_ifindex"] == 0 || before["peer_ifindex"] == peer["peer_ifindex"] {
		t.Errorf("peer_ifindex lwb %d, lwa %d", before["peer_ifindex"], peer["peer_ifindex"])
	}

	const n = 25
	if err := ns.sendFrames(n); err != nil {
		t.Fatal(err)
	}
	var after map[string]uint64
	// NAPI may finish the batch an instant after sendto returns
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if after, err = ns.stats("lwb"); err != nil {
			t.Fatal(err)
		}
		if after["rx_queue_0_xdp_packets"]-before["rx_queue_0_xdp_packets"] >= n || time.Now().After(deadline) {
			break
		}
	}
	if d := after["rx_queue_0_xdp_packets"] - before["rx_queue_0_xdp_packets"]; d < n {
		t.Errorf("rx_queue_0_xdp_packets rose by %d after %d frames (before %v, after %v)", d, n, before, after)
	}
	// veth counts skb->len after eth_type_trans: 60 - 14 = 46 bytes a frame
	if d := after["rx_queue_0_xdp_bytes"] - before["rx_queue_0_xdp_bytes"]; d < n*46 {
		t.Errorf("rx_queue_0_xdp_bytes rose by %d after %d frames of 46 bytes past the Ethernet header", d, n)
	}
}

// TestEthtoolCountersVethRates runs the sampler and Rates on the real veth
// statistics: the rate of received packets is positive and in packets/s,
// bytes in bytes/s.
func TestEthtoolCountersVethRates(t *testing.T) {
	ns := newVethNS(t)
	var s EthtoolCounters
	s.NetDevs = []string{"lwa", "lwb"}
	s.Read = ns.stats
	var smp Sampler = s
	prev, err := smp.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := prev.Counters["lwb/peer_ifindex"]; !ok {
		t.Fatalf("no lwb/peer_ifindex in %v", prev.Counters)
	}
	if err := ns.sendFrames(10); err != nil {
		t.Fatal(err)
	}
	var cur Snapshot
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if cur, err = smp.Sample(); err != nil {
			t.Fatal(err)
		}
		if cur.Counters["lwb/rx_queue_0_xdp_packets"]-prev.Counters["lwb/rx_queue_0_xdp_packets"] >= 10 || time.Now().After(deadline) {
			break
		}
	}
	rates, resets := Rates(prev, cur)
	if len(resets) != 0 {
		t.Errorf("resets %v", resets)
	}
	r, ok := rates["lwb/rx_queue_0_xdp_packets"]
	if !ok || r.Delta < 10 || r.PerSecond <= 0 || r.Unit != UnitPackets {
		t.Errorf("lwb/rx_queue_0_xdp_packets rate %+v, %v", r, ok)
	}
	if r := rates["lwb/rx_queue_0_xdp_bytes"]; r.Unit != UnitBytes || r.Delta < 10*46 {
		t.Errorf("lwb/rx_queue_0_xdp_bytes rate %+v", r)
	}
	if len(rates) != len(cur.Counters) {
		t.Errorf("%d rates for %d counters", len(rates), len(cur.Counters))
	}
	// a device that does not exist is an error, not an empty snapshot
	s.NetDevs = []string{"lwa", "lwgone"}
	if _, err := s.Sample(); err == nil || !errors.Is(err, unix.ENODEV) {
		t.Errorf("missing netdev: %v", err)
	}
}
