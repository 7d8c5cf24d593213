//go:build linux && cgo

package collectors

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// go-dcgm keeps one connection in package globals: one OpenDCGM at a time.
var dcgmOpen struct {
	sync.Mutex
	busy bool
}

// OpenDCGM connects to DCGM — the standalone nv-hostengine at opts.Address,
// or an embedded host engine when Address is empty — and watches, on every
// GPU DCGM supports, PCIe and NVLink bytes (profiling fields 1009–1012),
// the PCIe replay counter, current and maximum link generation and width,
// and the GPU's identity (NVML index, UUID, PCI bus id, name).
//
// libdcgm.so is loaded at run time (go-dcgm dlopens it in Init): on a host
// without it, or whose host engine does not answer within opts.Timeout, the
// error wraps ErrNoGPUCounters. Only one DCGM collector can be open per
// process (go-dcgm keeps its handle in package globals).
func OpenDCGM(opts DCGMOptions) (GPUCounters, error) {
	opts = opts.withDefaults()
	dcgmOpen.Lock()
	if dcgmOpen.busy {
		dcgmOpen.Unlock()
		return nil, errors.New("dcgm: a DCGM collector is already open in this process")
	}
	dcgmOpen.busy = true
	dcgmOpen.Unlock()

	type result struct {
		src *goDCGM
		err error
	}
	done := make(chan result, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		src, err := openGoDCGM(opts)
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			// OpenDCGM gave up waiting: undo what came too late.
			if err == nil {
				_ = src.Close()
			} else {
				releaseDCGM()
			}
			return
		}
		done <- result{src, err}
	}()
	timer := time.NewTimer(opts.Timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			releaseDCGM()
			return nil, r.err
		}
		return newDCGMCollector(r.src, opts), nil
	case <-timer.C:
		mu.Lock()
		defer mu.Unlock()
		select {
		case r := <-done: // finished while the timer fired
			if r.err != nil {
				releaseDCGM()
				return nil, r.err
			}
			return newDCGMCollector(r.src, opts), nil
		default:
		}
		abandoned = true
		return nil, errDCGMUnavailable(fmt.Sprintf("the host engine did not answer within %v", opts.Timeout), nil)
	}
}

func releaseDCGM() {
	dcgmOpen.Lock()
	dcgmOpen.busy = false
	dcgmOpen.Unlock()
}

// goDCGM is the dcgmSource over go-dcgm.
type goDCGM struct {
	group       dcgm.GroupHandle
	rateFields  dcgm.FieldHandle
	latestField dcgm.FieldHandle
	closeOnce   sync.Once
	closeErr    error
}

func shorts(fs []uint16) []dcgm.Short {
	out := make([]dcgm.Short, len(fs))
	for i, f := range fs {
		out[i] = dcgm.Short(f)
	}
	return out
}

func openGoDCGM(opts DCGMOptions) (*goDCGM, error) {
	var err error
	if opts.Address == "" {
		_, err = dcgm.Init(dcgm.Embedded)
	} else {
		sock := "0"
		if opts.UnixSocket {
			sock = "1"
		}
		_, err = dcgm.Init(dcgm.Standalone, opts.Address, sock)
	}
	if err != nil {
		// go-dcgm says "libdcgm.so not Found" when dlopen fails; anything
		// else is the host engine refusing or not there.
		if err.Error() == "libdcgm.so not Found" {
			return nil, errDCGMUnavailable("libdcgm.so could not be loaded", nil)
		}
		where := "embedded host engine"
		if opts.Address != "" {
			where = "nv-hostengine at " + opts.Address
		}
		return nil, errDCGMUnavailable(where, err)
	}
	s := &goDCGM{}
	fail := func(what string, err error) (*goDCGM, error) {
		_ = s.Close()
		return nil, fmt.Errorf("dcgm: %s: %w", what, err)
	}
	ids, err := dcgm.GetSupportedDevices()
	if err != nil {
		return fail("listing GPUs", err)
	}
	if len(ids) == 0 {
		_ = s.Close()
		return nil, errDCGMUnavailable("DCGM supports none of this host's GPUs", nil)
	}
	suffix := strconv.Itoa(int(time.Now().UnixNano() % 1e9))
	if s.group, err = dcgm.CreateGroup("lanewatch-" + suffix); err != nil {
		return fail("creating the GPU group", err)
	}
	for _, id := range ids {
		if err := dcgm.AddToGroup(s.group, id); err != nil {
			return fail("adding a GPU to the group", err)
		}
	}
	if s.rateFields, err = dcgm.FieldGroupCreate("lanewatch-rates-"+suffix, shorts(dcgmRateFields)); err != nil {
		return fail("creating the field group", err)
	}
	if s.latestField, err = dcgm.FieldGroupCreate("lanewatch-latest-"+suffix, shorts(dcgmLatestFields)); err != nil {
		return fail("creating the field group", err)
	}
	freq := opts.UpdateInterval.Microseconds()
	keep := opts.KeepAge.Seconds()
	// maxKeepSamples 0: bounded by age only, so Since loses nothing
	// between two Sample calls less than KeepAge apart.
	if err := dcgm.WatchFieldsWithGroupEx(s.rateFields, s.group, freq, keep, 0); err != nil {
		return fail("watching PCIe/NVLink profiling fields (another profiler such as Nsight or DCGM's own exporter with a different interval can hold them)", err)
	}
	if err := dcgm.WatchFieldsWithGroupEx(s.latestField, s.group, freq, keep, 1); err != nil {
		return fail("watching device fields", err)
	}
	return s, nil
}

func (s *goDCGM) GPUs() ([]uint, error) { return dcgm.GetSupportedDevices() }

func (s *goDCGM) Latest(gpu uint, fields []uint16) ([]dcgmValue, error) {
	fv, err := dcgm.EntityGetLatestValues(dcgm.FE_GPU, gpu, shorts(fields))
	if err != nil {
		return nil, err
	}
	out := make([]dcgmValue, len(fv))
	for i, v := range fv {
		out[i] = dcgmValue{GPU: gpu, Field: uint16(v.FieldId), Ts: v.Ts, Status: v.Status, Type: byte(v.FieldType)}
		switch out[i].Type {
		case 'i':
			out[i].Int = v.Int64()
		case 'd':
			out[i].Float = v.Float64()
		case 's':
			out[i].Str = v.String()
		}
	}
	return out, nil
}

func (s *goDCGM) Since(sinceUs int64) ([]dcgmValue, int64, error) {
	// time.Unix(0, 0), not time.Time{}: go-dcgm passes UnixMicro() on,
	// and only 0 means "everything kept".
	fv, next, err := dcgm.GetValuesSince(s.group, s.rateFields, time.UnixMicro(sinceUs))
	if err != nil {
		return nil, sinceUs, err
	}
	out := make([]dcgmValue, 0, len(fv))
	for _, v := range fv {
		if v.EntityGroupId != dcgm.FE_GPU {
			continue
		}
		d := dcgmValue{GPU: v.EntityId, Field: uint16(v.FieldId), Ts: v.Ts, Status: v.Status, Type: byte(v.FieldType)}
		switch d.Type {
		case 'i':
			d.Int = v.Int64()
		case 'd':
			d.Float = v.Float64()
		}
		out = append(out, d)
	}
	return out, next.UnixMicro(), nil
}

func (s *goDCGM) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		var zeroF dcgm.FieldHandle
		var zeroG dcgm.GroupHandle
		if s.rateFields != zeroF {
			errs = append(errs, dcgm.FieldGroupDestroy(s.rateFields))
		}
		if s.latestField != zeroF {
			errs = append(errs, dcgm.FieldGroupDestroy(s.latestField))
		}
		if s.group != zeroG {
			errs = append(errs, dcgm.DestroyGroup(s.group))
		}
		errs = append(errs, dcgm.Shutdown())
		releaseDCGM()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
