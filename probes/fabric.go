package probes

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// libfabric exports its constructors only (fi_getinfo, fi_fabric): every
// other call an application makes (fi_domain, fi_endpoint, fi_send,
// fi_cq_read, ...) is an inline wrapper calling through the ops table of
// the object it is given, and the providers' functions are static. So the
// data path is found the way an RDMA provider's is (ResolveProviderOps):
// from the object a constructor returned, read in the process, each
// function attached at its file offset. A fabric names its domain
// constructor, a domain its endpoint and CQ constructors, an endpoint its
// send, write and read functions, a CQ its read (docs/design.md,
// "Transfer libraries").

// Struct layouts of libfabric's public headers (rdma/fabric.h,
// fi_domain.h, fi_endpoint.h, fi_eq.h; the ABI is kept across 1.x). A test
// compiles offsetof() against the system headers to keep them honest.
const (
	fidClass          = 0  // struct fid: size_t fclass
	fidOps            = 16 // struct fid: struct fi_ops *ops
	fiOpsBind         = 16 // struct fi_ops: bind
	fabricOps         = 24 // struct fid_fabric: struct fi_ops_fabric *ops
	fabricOpsDomain   = 8
	domainOps         = 24 // struct fid_domain: struct fi_ops_domain *ops
	domainOpsCQOpen   = 16
	domainOpsEndpoint = 24
	epMsg             = 40 // struct fid_ep: msg, rma, tagged ops
	epRMA             = 48
	epTagged          = 56
	msgSend           = 32 // struct fi_ops_msg (fi_ops_tagged alike)
	msgSendMsg        = 48
	msgInject         = 56
	msgSendData       = 64
	rmaRead           = 8 // struct fi_ops_rma
	rmaReadMsg        = 24
	rmaWrite          = 32
	rmaWriteMsg       = 48
	rmaInject         = 56
	rmaWriteData      = 64
	cqOps             = 24 // struct fid_cq: struct fi_ops_cq *ops
	cqOpsRead         = 8
	infoDomainAttr    = 96  // struct fi_info: struct fi_domain_attr *domain_attr
	infoFabricAttr    = 104 // struct fi_info: struct fi_fabric_attr *fabric_attr
	fabricAttrProv    = 16  // struct fi_fabric_attr: char *prov_name
	domainAttrName    = 8   // struct fi_domain_attr: char *name
)

// FI_CLASS_* of the objects whose ops are read (enum fi_fabric_class).
const (
	fiClassFabric = 1
	fiClassDomain = 2
	fiClassEP     = 3
	fiClassCQ     = 14
)

// FITransmit is FI_TRANSMIT, the fi_ep_bind flag binding a CQ to an
// endpoint's transmit completions.
const FITransmit = 1 << 11

// Rows of the libfabric data path, attached by file offset.
const (
	FabricRowDomain   = ProviderPrefix + "fi_domain"
	FabricRowEndpoint = ProviderPrefix + "fi_endpoint"
	FabricRowCQOpen   = ProviderPrefix + "fi_cq_open"
)

// fabricOp is one function an object's ops name: the ops table's pointer
// at table in the object, the function's at fn in the table.
type fabricOp struct {
	row       string
	table, fn uint64
}

// fabricStages says, for each row whose result is a libfabric object, the
// object's class and the functions its ops name, attached as rows.
var fabricStages = map[string]struct {
	class uint64
	ops   []fabricOp
}{
	"fi_fabric":     {fiClassFabric, []fabricOp{{FabricRowDomain, fabricOps, fabricOpsDomain}}},
	FabricRowDomain: {fiClassDomain, []fabricOp{{FabricRowEndpoint, domainOps, domainOpsEndpoint}, {FabricRowCQOpen, domainOps, domainOpsCQOpen}}},
	FabricRowEndpoint: {fiClassEP, []fabricOp{
		{ProviderPrefix + "fi_ep_bind", fidOps, fiOpsBind},
		{ProviderPrefix + "fi_send", epMsg, msgSend}, {ProviderPrefix + "fi_senddata", epMsg, msgSendData},
		{ProviderPrefix + "fi_inject", epMsg, msgInject},
		{ProviderPrefix + "fi_tsend", epTagged, msgSend}, {ProviderPrefix + "fi_tinject", epTagged, msgInject},
		{ProviderPrefix + "fi_write", epRMA, rmaWrite}, {ProviderPrefix + "fi_writedata", epRMA, rmaWriteData},
		{ProviderPrefix + "fi_inject_write", epRMA, rmaInject}, {ProviderPrefix + "fi_read", epRMA, rmaRead},
		{ProviderPrefix + "fi_sendmsg", epMsg, msgSendMsg}, {ProviderPrefix + "fi_tsendmsg", epTagged, msgSendMsg},
		{ProviderPrefix + "fi_writemsg", epRMA, rmaWriteMsg}, {ProviderPrefix + "fi_readmsg", epRMA, rmaReadMsg},
	}},
	FabricRowCQOpen: {fiClassCQ, []fabricOp{{ProviderPrefix + "fi_cq_read", cqOps, cqOpsRead}}},
}

// FabricStage says whether row's result is a libfabric object whose ops
// name functions to probe.
func FabricStage(row string) bool {
	_, ok := fabricStages[row]
	return ok
}

// FabricRows lists the rows attached from libfabric objects, stage by
// stage: what a process's data path needs probed before it is traced.
func FabricRows() []string {
	var out []string
	for _, row := range []string{"fi_fabric", FabricRowDomain, FabricRowEndpoint, FabricRowCQOpen} {
		for _, op := range fabricStages[row].ops {
			out = append(out, op.row)
		}
	}
	return out
}

// ResolveFabricOps reads, out of the libfabric object obj that row
// returned in process pid, the provider functions its ops name, and
// locates each in a mapped file, checked like ResolveProviderOps' (a
// function start by the file's unwind table). The object must be of the
// row's class. An ops table an object does not have (an endpoint without
// RMA) or a NULL function is skipped; any other pointer that is not a
// function is an error naming it.
func ResolveFabricOps(procRoot string, pid int, row string, obj uint64) ([]ProviderFunc, error) {
	st, ok := fabricStages[row]
	if !ok {
		return nil, fmt.Errorf("row %s returns no libfabric object", row)
	}
	mem, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "mem"))
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	defer mem.Close()
	word := func(at uint64, what string) (uint64, error) {
		var b [8]byte
		if _, err := mem.ReadAt(b[:], int64(at)); err != nil {
			return 0, fmt.Errorf("pid %d: read %s of %s %#x: %w", pid, what, row, obj, err)
		}
		return binary.LittleEndian.Uint64(b[:]), nil
	}
	class, err := word(obj+fidClass, "fclass")
	if err != nil {
		return nil, err
	}
	if class != st.class {
		return nil, fmt.Errorf("pid %d: %s returned %#x of class %d, want %d; not attached", pid, row, obj, class, st.class)
	}
	maps, err := ReadMaps(procRoot, pid)
	if err != nil {
		return nil, err
	}
	var out []ProviderFunc
	for _, op := range st.ops {
		table, err := word(obj+op.table, "ops table")
		if err != nil {
			return nil, err
		}
		if table == 0 {
			continue
		}
		// Every ops table starts with its size: a provider built against
		// older headers has a shorter one.
		size, err := word(table, "ops size")
		if err != nil {
			return nil, err
		}
		if op.table != fidOps && size < op.fn+8 {
			continue
		}
		addr, err := word(table+op.fn, op.row)
		if err != nil {
			return nil, err
		}
		if addr == 0 {
			continue
		}
		f, err := locateFunction(procRoot, pid, maps, addr)
		if err != nil {
			return nil, fmt.Errorf("pid %d: %s %#x: %s = %#x: %w; not attached", pid, row, obj, op.row, addr, err)
		}
		f.Row = op.row
		out = append(out, f)
	}
	return out, nil
}

// FabricNames reads the provider's name (fabric_attr->prov_name, "tcp;ofi_rxm")
// and the domain's ("lo", "rdmap0s6-rdm") out of the struct fi_info at info
// in process pid: the application keeps it for the objects it opened with
// it, so it outlives the call that was given it.
func FabricNames(procRoot string, pid int, info uint64) (provider, domain string, err error) {
	mem, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "mem"))
	if err != nil {
		return "", "", fmt.Errorf("pid %d: %w", pid, err)
	}
	defer mem.Close()
	str := func(attrAt, field uint64, what string) (string, error) {
		var b [8]byte
		if _, err := mem.ReadAt(b[:], int64(info+attrAt)); err != nil {
			return "", fmt.Errorf("pid %d: read fi_info %#x: %w", pid, info, err)
		}
		attr := binary.LittleEndian.Uint64(b[:])
		if attr == 0 {
			return "", fmt.Errorf("pid %d: fi_info %#x has no %s", pid, info, what)
		}
		if _, err := mem.ReadAt(b[:], int64(attr+field)); err != nil {
			return "", fmt.Errorf("pid %d: read %s of fi_info %#x: %w", pid, what, info, err)
		}
		p := binary.LittleEndian.Uint64(b[:])
		if p == 0 {
			return "", fmt.Errorf("pid %d: fi_info %#x: %s is NULL", pid, info, what)
		}
		var s [64]byte
		n, _ := mem.ReadAt(s[:], int64(p)) // a string near a mapping's end reads short
		i := bytes.IndexByte(s[:n], 0)
		if i <= 0 || !printable(s[:i]) {
			return "", fmt.Errorf("pid %d: fi_info %#x: %s at %#x is not a name", pid, info, what, p)
		}
		return string(s[:i]), nil
	}
	if provider, err = str(infoFabricAttr, fabricAttrProv, "fabric_attr->prov_name"); err != nil {
		return "", "", err
	}
	domain, err = str(infoDomainAttr, domainAttrName, "domain_attr->name")
	return provider, domain, err
}

func printable(b []byte) bool {
	return !strings.ContainsFunc(string(b), func(r rune) bool { return r < 0x20 || r > 0x7e })
}
