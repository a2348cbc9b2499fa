package bmc

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// fakeBMC answers from tables; missing channels fail like a real BMC's
// "invalid channel" completion code.
type fakeBMC struct {
	media  map[uint8]uint8
	params map[[2]uint8][]byte
}

func (f fakeBMC) ChannelMedium(_ context.Context, ch uint8) (uint8, error) {
	m, ok := f.media[ch]
	if !ok {
		return 0, errors.New("completion code 0xcc")
	}
	return m, nil
}

func (f fakeBMC) LanParam(_ context.Context, ch, p uint8) ([]byte, error) {
	d, ok := f.params[[2]uint8{ch, p}]
	if !ok {
		return nil, errors.New("completion code 0x80")
	}
	return d, nil
}

func TestRead(t *testing.T) {
	mac := []byte{0x0c, 0xc4, 0x7a, 0x01, 0x02, 0x03}
	for name, tc := range map[string]struct {
		bmc     fakeBMC
		want    *inventoryv1.Facts_BmcLan
		wantErr error
	}{
		"LAN on channel 1": {
			bmc:  fakeBMC{media: map[uint8]uint8{1: 4, 7: 5}, params: map[[2]uint8][]byte{{1, 3}: {10, 0, 0, 21}, {1, 5}: mac}},
			want: &inventoryv1.Facts_BmcLan{Channel: 1, Ipv4Address: "10.0.0.21", Mac: "0c:c4:7a:01:02:03"},
		},
		"unconfigured channel 1, address on channel 8": {
			bmc: fakeBMC{media: map[uint8]uint8{1: 4, 8: 4}, params: map[[2]uint8][]byte{
				{1, 3}: {0, 0, 0, 0}, {1, 5}: mac, {8, 3}: {192, 168, 1, 50}, {8, 5}: mac,
			}},
			want: &inventoryv1.Facts_BmcLan{Channel: 8, Ipv4Address: "192.168.1.50", Mac: "0c:c4:7a:01:02:03"},
		},
		"LAN without address": {
			bmc:  fakeBMC{media: map[uint8]uint8{2: 4}, params: map[[2]uint8][]byte{{2, 5}: mac}},
			want: &inventoryv1.Facts_BmcLan{Channel: 2, Mac: "0c:c4:7a:01:02:03"},
		},
		"no LAN channel": {
			bmc:     fakeBMC{media: map[uint8]uint8{7: 5}},
			wantErr: ErrNoLAN,
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Read(context.Background(), tc.bmc)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Read error = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Read (-want +got):\n%s", diff)
			}
		})
	}
}
