package probes

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// lw_modify_qp_enter reads struct ibv_qp_attr at the offsets enum lw_qp_arg
// names: checked against the system's rdma-core verbs.h.
func TestModifyQPLayout(t *testing.T) {
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("libibverbs-dev is missing (verbs.h)")
		}
		t.Skip("libibverbs-dev is missing")
	}
	const src = `#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>
int main(void) {
	printf("%zu %zu %zu %zu %zu %zu %zu %d %d\n", offsetof(struct ibv_qp, qp_num), offsetof(struct ibv_qp_attr, dest_qp_num),
	       offsetof(struct ibv_qp_attr, ah_attr), offsetof(struct ibv_ah_attr, grh.dgid), offsetof(struct ibv_ah_attr, dlid),
	       offsetof(struct ibv_ah_attr, is_global), sizeof(struct ibv_ah_attr), IBV_QP_AV, IBV_QP_DEST_QPN);
	return 0;
}
`
	dir := t.TempDir()
	c, bin := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-o", bin, c).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	// qp_num (IBV_QP_QP_NUM in lanewatch.bpf.c), the two offsets of enum
	// lw_qp_arg, the address vector's word LW_QP_AV (bytes 24..31: dlid at
	// 24, is_global at 29) after the 16-byte dgid, and the mask bits
	// correlate.QPPeer tests.
	want := []string{"52", strconv.Itoa(int(lanewatchLwQpArgLW_QP_DEST_QPN_OFF)), strconv.Itoa(int(lanewatchLwQpArgLW_QP_AH_ATTR_OFF)),
		"0", "24", "29", "32", "128", "1048576"}
	if got := strings.Fields(string(out)); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("verbs.h layout %v, want %v", got, want)
	}
}

// What ibv_modify_qp decodes to from the slots lw_modify_qp_enter fills:
// the QP, its number and its destination, the mask, the GID in memory
// order, the LID and the global flag from the address vector's word.
func TestDecodeModifyQP(t *testing.T) {
	var args [9]uint64
	args[0], args[1], args[2] = 0x5000, 0x6000, 0x80|0x100000|1
	args[lanewatchLwQpArgLW_QP_NUMS] = 257 | 300<<32
	// fe80::1:0:ab4 as memory holds it: bytes 0..7 then 8..15, little-endian words
	args[lanewatchLwQpArgLW_QP_DGID] = 0x80fe
	args[lanewatchLwQpArgLW_QP_DGID+1] = 0xb40a000001000000
	args[lanewatchLwQpArgLW_QP_AV] = 7 | 1<<40 | 1<<48 // dlid 7, is_global 1, port 1
	var c event.Call
	if err := Decode(rawEvent(rowOf(t, "ibv_modify_qp"), args, 0, 0), &c); err != nil {
		t.Fatal(err)
	}
	r := c.RDMA
	wantGID := [16]byte{0xfe, 0x80, 11: 1, 14: 0x0a, 15: 0xb4}
	if c.Op != event.OpQPModify || c.Layer != event.LayerVerbs || !c.Returns || r.QP != 0x5000 || r.QPNum != 257 ||
		r.DestQPNum != 300 || r.AttrMask != 0x100081 || r.DGID != wantGID || r.DLID != 7 || !r.IsGlobal {
		t.Errorf("decoded %+v", r)
	}
	args[lanewatchLwQpArgLW_QP_AV] = 9 // an InfiniBand LID, no GRH
	if err := Decode(rawEvent(rowOf(t, "ibv_modify_qp"), args, 0, 0), &c); err != nil {
		t.Fatal(err)
	}
	if c.RDMA.IsGlobal || c.RDMA.DLID != 9 {
		t.Errorf("no GRH: %+v", c.RDMA)
	}
}
