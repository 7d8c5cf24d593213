//go:build linux && cgo

package collectors

import (
	"testing"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// TestDCGMFieldIDs checks the ids copied into gpu_dcgm.go against go-dcgm's.
func TestDCGMFieldIDs(t *testing.T) {
	for got, want := range map[uint16]int{
		dcgmFieldName:          dcgm.DCGM_FI_DEV_NAME,
		dcgmFieldNVMLIndex:     dcgm.DCGM_FI_DEV_NVML_INDEX,
		dcgmFieldUUID:          dcgm.DCGM_FI_DEV_UUID,
		dcgmFieldPCIBusID:      dcgm.DCGM_FI_DEV_PCI_BUSID,
		dcgmFieldPCIeReplay:    dcgm.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
		dcgmFieldMaxLinkGen:    dcgm.DCGM_FI_DEV_PCIE_MAX_LINK_GEN,
		dcgmFieldMaxLinkWidth:  dcgm.DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH,
		dcgmFieldLinkGen:       dcgm.DCGM_FI_DEV_PCIE_LINK_GEN,
		dcgmFieldLinkWidth:     dcgm.DCGM_FI_DEV_PCIE_LINK_WIDTH,
		dcgmFieldPCIeTxBytes:   dcgm.DCGM_FI_PROF_PCIE_TX_BYTES,
		dcgmFieldPCIeRxBytes:   dcgm.DCGM_FI_PROF_PCIE_RX_BYTES,
		dcgmFieldNVLinkTxBytes: dcgm.DCGM_FI_PROF_NVLINK_TX_BYTES,
		dcgmFieldNVLinkRxBytes: dcgm.DCGM_FI_PROF_NVLINK_RX_BYTES,
	} {
		if int(got) != want {
			t.Errorf("field id %d, go-dcgm says %d", got, want)
		}
	}
	if dcgm.DCGM_FT_INT64_BLANK != dcgmInt64Blank || dcgm.DCGM_FT_INT32_BLANK != dcgmInt32Blank ||
		dcgm.DCGM_FT_FP64_BLANK != dcgmFloat64Blank {
		t.Error("blank markers differ from go-dcgm's")
	}
}
