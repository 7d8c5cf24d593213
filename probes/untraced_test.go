package probes

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// Debian's real libraries (libucx0, libfabric1, ibverbs-providers).
const (
	uctIBPath    = "/usr/lib/x86_64-linux-gnu/ucx/libuct_ib.so.0"
	libfabricLib = "/usr/lib/x86_64-linux-gnu/libfabric.so.1"
	libmlx5Path  = "/usr/lib/x86_64-linux-gnu/libmlx5.so.1"
)

func TestClassifyObject(t *testing.T) {
	mlx5 := []string{"libibverbs.so.1", "libmlx5.so.1", "libc.so.6"}
	for _, tc := range []struct {
		name string
		o    ObjectFacts
		kind string // "": traced, or nothing to see
		sign string
	}{
		// mlx5 direct verbs: the imports that hand over the data path.
		{"init_obj", ObjectFacts{"libkvdirect.so", mlx5, []string{"ibv_open_device", "mlx5dv_init_obj"}}, UntracedMLX5DV, "imports mlx5dv_init_obj"},
		{"devx", ObjectFacts{"libkvdevx.so", mlx5, []string{"mlx5dv_devx_umem_reg", "mlx5dv_devx_obj_create"}}, UntracedMLX5DV, "imports mlx5dv_devx_obj_create"},
		// The most telling import is named, whatever the table's order.
		{"init_obj named first", ObjectFacts{"libkv.so", mlx5, []string{"mlx5dv_devx_obj_create", "mlx5dv_init_obj"}}, UntracedMLX5DV, "imports mlx5dv_init_obj"},
		{"mlx5dv wr", ObjectFacts{"libdc.so", mlx5, []string{"mlx5dv_qp_ex_from_ibv_qp_ex", "mlx5dv_wr_set_dc_addr"}}, UntracedMLX5DV, "imports mlx5dv_qp_ex_from_ibv_qp_ex"},
		// Queries move nothing: a QP made by mlx5dv_create_qp still posts
		// through ibv_post_send unless it uses the wr API.
		{"mlx5dv queries", ObjectFacts{"libq.so", mlx5, []string{"mlx5dv_is_supported", "mlx5dv_query_device", "mlx5dv_create_qp", "ibv_post_send"}}, "", ""},
		// An import without its library among DT_NEEDED is not read.
		{"no libmlx5 needed", ObjectFacts{"libx.so", []string{"libc.so.6"}, []string{"mlx5dv_init_obj"}}, "", ""},
		{"verbs wr", ObjectFacts{"libwr.so", []string{"libibverbs.so.1"}, []string{"ibv_create_qp_ex", "ibv_qp_to_qp_ex"}}, UntracedVerbsWR, "imports ibv_qp_to_qp_ex"},
		{"plain verbs", ObjectFacts{"libtransfer_engine.so", []string{"libibverbs.so.1"}, []string{"ibv_reg_mr", "ibv_create_qp"}}, "", ""},
		{"gdrcopy user", ObjectFacts{"deep_ep_cpp.cpython-312-x86_64-linux-gnu.so", []string{"libgdrapi.so.2"}, []string{"gdr_open", "gdr_pin_buffer", "gdr_map"}}, UntracedGDRCopy, "imports gdr_map"},
		// Traced at their own level, or serving objects named instead.
		{"UCX's UCT", ObjectFacts{"libuct_ib.so.0", mlx5, []string{"mlx5dv_init_obj"}}, "", ""},
		{"UCX's mlx5 module", ObjectFacts{"libuct_ib_mlx5.so.0", mlx5, []string{"mlx5dv_devx_obj_create"}}, "", ""},
		{"UCX's GDA", ObjectFacts{"libuct_ib_mlx5_gda.so.0", mlx5, []string{"mlx5dv_devx_umem_reg"}}, UntracedGPUInitiated, "named libuct_ib_mlx5_gda.so.0"},
		{"UCX's gdr_copy", ObjectFacts{"libuct_cuda_gdrcopy.so.0", []string{"libgdrapi.so.2"}, []string{"gdr_map"}}, "", ""},
		{"libfabric", ObjectFacts{"libfabric.so.1", []string{"libibverbs.so.1"}, []string{"ibv_qp_to_qp_ex"}}, "", ""},
		{"libmlx5", ObjectFacts{"libmlx5.so.1", []string{"libibverbs.so.1"}, nil}, "", ""},
		{"provider link", ObjectFacts{"libmlx5-rdmav34.so", nil, nil}, "", ""},
		{"libgdrapi", ObjectFacts{"libgdrapi.so.2.4", nil, nil}, "", ""},
		// Named for what they do.
		{"IBGDA", ObjectFacts{"nvshmem_transport_ibgda.so.3", nil, nil}, UntracedGPUInitiated, "named nvshmem_transport_ibgda.so.3"},
		{"NVSHMEM GPUNetIO", ObjectFacts{"nvshmem_transport_gpunetio.so.3", nil, nil}, UntracedGPUInitiated, "named nvshmem_transport_gpunetio.so.3"},
		{"NVSHMEM host", ObjectFacts{"libnvshmem_host.so.3", nil, nil}, UntracedNVSHMEM, "named libnvshmem_host.so.3"},
		{"DOCA GPUNetIO", ObjectFacts{"libdoca_gpunetio.so.2", nil, nil}, UntracedGPUInitiated, "named libdoca_gpunetio.so.2"},
		{"DOCA RDMA", ObjectFacts{"libdoca_rdma.so.2", nil, nil}, UntracedDOCA, "named libdoca_rdma.so.2"},
		// The transports NVSHMEM proxies through the CPU are seen at their
		// library (verbs, UCX, libfabric); the NVSHMEM host library names
		// the process.
		{"NVSHMEM IBRC", ObjectFacts{"nvshmem_transport_ibrc.so.3", []string{"libibverbs.so.1"}, nil}, "", ""},
		{"libc", ObjectFacts{"libc.so.6", []string{"ld-linux-x86-64.so.2"}, nil}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, ok := ClassifyObject(tc.o)
			if ok != (tc.kind != "") || u.Kind != tc.kind || u.Sign != tc.sign {
				t.Fatalf("got %+v %v, want kind %q sign %q", u, ok, tc.kind, tc.sign)
			}
			if ok && (strings.HasPrefix(u.Reason(), "unknown") || !strings.Contains(u.String(), u.Sign)) {
				t.Errorf("kind %q: reason %q, text %q", u.Kind, u.Reason(), u.String())
			}
		})
	}
}

// Debian's real libraries: UCX's libuct_ib imports mlx5dv_* and libfabric
// ibv_qp_to_qp_ex, both traced at their own level; the same bytes under
// another name are read and named by their imports.
func TestUntracedObjectRealLibraries(t *testing.T) {
	for _, p := range []string{uctIBPath, libfabricLib, libmlx5Path} {
		needFile(t, p)
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		path, kind, sign string
	}{
		{uctIBPath, "", ""},
		{libfabricLib, "", ""},
		{libmlx5Path, "", ""},
		{libcPath, "", ""},
		{copyFile(t, uctIBPath, filepath.Join(dir, "libkvdirect.so")), UntracedMLX5DV, "imports mlx5dv_init_obj"},
		{copyFile(t, libfabricLib, filepath.Join(dir, "libwrpost.so")), UntracedVerbsWR, "imports ibv_qp_to_qp_ex"},
		{copyFile(t, "/bin/sh", filepath.Join(dir, "nvshmem_transport_ibgda.so.3")), UntracedGPUInitiated, "named nvshmem_transport_ibgda.so.3"},
	} {
		u, ok, err := UntracedObject(tc.path, tc.path)
		if err != nil || ok != (tc.kind != "") || u.Kind != tc.kind || !strings.HasPrefix(u.Sign, tc.sign) || (ok && u.Path != tc.path) {
			t.Errorf("%s: got %+v %v %v, want kind %q sign %q…", tc.path, u, ok, err, tc.kind, tc.sign)
		}
	}
	// Not ELF: a JIT's code file is no object; a file that cannot be read
	// is an error naming it.
	txt := filepath.Join(dir, "jit.bin")
	os.WriteFile(txt, []byte("\xc3\xc3\xc3\xc3 not ELF"), 0o644)
	if u, ok, err := UntracedObject(txt, txt); ok || err != nil {
		t.Errorf("not ELF: %+v %v %v", u, ok, err)
	}
	bad := filepath.Join(dir, "libbad.so")
	os.WriteFile(bad, []byte("\x7fELF\x02\x01\x01 cut short"), 0o644)
	if _, _, err := UntracedObject(bad, bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("cut-short ELF: %v, want an error naming it", err)
	}
	if _, _, err := UntracedObject(filepath.Join(dir, "gone.so"), "gone.so"); err == nil || !strings.Contains(err.Error(), "gone.so") {
		t.Errorf("missing file: %v", err)
	}
}

// A real process that dlopens an object importing mlx5dv_init_obj (and
// with it the real libmlx5 and libibverbs) is named by that object alone.
func TestUntracedProcessMLX5DV(t *testing.T) {
	testenv.RequireRoot(t)
	lib := testenv.DirectVerbsLib(t, t.TempDir())
	pid, _ := testenv.LoadingProcess(t, lib)
	maps, err := ReadMaps("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	var c UntracedFiles
	got, errs := c.Process("/proc", pid, maps)
	if len(errs) > 0 {
		t.Errorf("objects not read: %v", errs)
	}
	if len(got) != 1 || got[0].Path != lib || got[0].Kind != UntracedMLX5DV || got[0].Sign != "imports mlx5dv_init_obj" {
		t.Fatalf("got %+v, want %s alone, mlx5dv by mlx5dv_init_obj", got, lib)
	}
	// The verdict is kept by file: the same process again reads nothing,
	// even once the file is gone from its path.
	os.Remove(lib)
	again, errs := c.Process("/proc", pid, maps)
	if len(again) != 1 || again[0] != got[0] || len(errs) > 0 {
		t.Errorf("second look: %+v %v", again, errs)
	}
	// The loader with libmlx5 alone maps no such object.
	plain, _ := testenv.LoadingProcess(t, libmlx5Path)
	maps, err = ReadMaps("/proc", plain)
	if err != nil {
		t.Fatal(err)
	}
	if got, errs := new(UntracedFiles).Process("/proc", plain, maps); len(got) > 0 || len(errs) > 0 {
		t.Errorf("libmlx5 alone: %+v %v", got, errs)
	}
}

func FuzzUntracedObject(f *testing.F) {
	for _, p := range []string{uctIBPath, libfabricLib, libmlx5Path} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b[:min(len(b), 64<<10)]) // the headers, cut off
		}
	}
	if _, err := exec.LookPath("gcc"); err == nil {
		if _, err := os.Stat("/usr/include/infiniband/mlx5dv.h"); err == nil {
			b, err := os.ReadFile(testenv.DirectVerbsLib(f, f.TempDir()))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Add([]byte("not an ELF"))
	dir := f.TempDir()
	if shm, err := os.MkdirTemp("/dev/shm", "lwfuzz"); err == nil {
		dir = shm
		f.Cleanup(func() { os.RemoveAll(shm) })
	}
	path := filepath.Join(dir, "libobj.so")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		u, ok, err := UntracedObject(path, path)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if ok != (u.Kind != "") || (ok && (u.Path != path || !strings.HasPrefix(u.Sign, "imports "))) {
			t.Fatalf("verdict %+v %v", u, ok)
		}
	})
}
