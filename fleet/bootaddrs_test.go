package fleet

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	storev1 "github.com/corralhq/corral/api/store/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// TestScanLease: the wire scan reads what record.Unmarshal reads, and
// refuses (for a full decode) whatever it cannot read the same way.
func TestScanLease(t *testing.T) {
	lease := &bootv1.Lease{Ip: "10.0.0.5", Mac: "aa:bb:cc:00:00:01", State: bootv1.Lease_STATE_ACTIVE, ExpiresUnix: 99,
		UpdatedUnix: 42, Subnet: "10.0.0.0/24", Hostname: "h", Relay: "10.9.0.1"}
	good, err := record.Marshal(lease)
	if err != nil {
		t.Fatal(err)
	}
	envelope := func(ver uint32, v proto.Message) []byte {
		a := &anypb.Any{}
		if err := anypb.MarshalFrom(a, v, proto.MarshalOptions{}); err != nil {
			t.Fatal(err)
		}
		b, err := proto.Marshal(&storev1.Record{SchemaVersion: ver, Value: a})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A lease whose hostname (field 7) is not UTF-8: record.Unmarshal
	// refuses it.
	lb, err := proto.Marshal(&bootv1.Lease{Ip: "10.0.0.5", Mac: "aa:bb:cc:00:00:01"})
	if err != nil {
		t.Fatal(err)
	}
	badUTF8, err := proto.Marshal(&storev1.Record{SchemaVersion: record.SchemaVersion,
		Value: &anypb.Any{TypeUrl: "type.googleapis.com/corral.boot.v1.Lease", Value: append(lb, 0x3a, 1, 0xff)}})
	if err != nil {
		t.Fatal(err)
	}
	twice := append(append([]byte(nil), good...), good[2:]...) // the envelope's value field again
	if !strings.HasPrefix(string(good[:1]), "\x08") {
		t.Fatalf("unexpected envelope shape %x", good[:4])
	}
	for name, b := range map[string][]byte{
		"written by record.Marshal": good,
		"not deterministic":         envelope(record.SchemaVersion, lease),
		"older schema":              envelope(1, lease),
		"newer schema":              envelope(record.SchemaVersion+1, lease),
		"another type":              envelope(record.SchemaVersion, &inventoryv1.Machine{Name: "m", BootMac: "aa:bb:cc:00:00:01"}),
		"invalid UTF-8":             badUTF8,
		"value twice":               twice,
		"empty":                     nil,
		"garbage":                   []byte("\xff\xff\xff"),
		"truncated":                 good[:len(good)-3],
	} {
		t.Run(name, func(t *testing.T) {
			var l bootv1.Lease
			full := record.Unmarshal(b, &l) == nil
			lf, ok := scanLease(b)
			if ok && !full {
				t.Fatalf("scanned a record record.Unmarshal refuses")
			}
			if ok {
				got := []any{string(lf.ip), string(lf.mac), lf.updated}
				want := []any{l.GetIp(), l.GetMac(), l.GetUpdatedUnix()}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("scan differs from the full decode (-want +got):\n%s", diff)
				}
			}
			if name == "written by record.Marshal" && !ok {
				t.Error("the common shape was not scanned")
			}
		})
	}
}

// countingStore counts List calls on a real store.
type countingStore struct {
	store.Store
	lists atomic.Int64
}

func (c *countingStore) List(ctx context.Context, prefix string) ([]store.KV, error) {
	c.lists.Add(1)
	return c.Store.List(ctx, prefix)
}

// TestBootAddrsListsOnlyForMachines: with runners that have boot segments
// but no machine with a boot MAC, the leases are never listed; once a
// machine has one they are (at most once per Interval).
func TestBootAddrsListsOnlyForMachines(t *testing.T) {
	r := newRig(t)
	cs := &countingStore{Store: r.st}
	r.d.Store = cs
	r.s = r.d.newDispatch()
	for i := range 50 {
		l := &bootv1.Lease{Ip: "192.168.0." + string(rune('0'+i%10)), Mac: "aa:bb:cc:00:00:99", UpdatedUnix: int64(i)}
		if _, err := record.Put(context.Background(), r.st, LeasePrefix+l.Ip+"-"+string(rune('a'+i)), l, 0); err != nil {
			t.Fatal(err)
		}
	}
	r.beat(t, appliance("a", "", nil, []string{"192.168.0.0/24"}), time.Second)
	r.machine(t, "m0", "", "")
	r.pass(t)
	r.clk.Advance(2 * DefaultDispatchInterval)
	r.beat(t, appliance("a", "", nil, []string{"192.168.0.0/24"}), time.Second)
	r.pass(t)
	if n := cs.lists.Load(); n != 0 {
		t.Errorf("leases listed %d times with no machine wanting one", n)
	}
	r.machine(t, "m1", "", "aa:bb:cc:00:00:99")
	r.clk.Advance(2 * DefaultDispatchInterval)
	r.beat(t, appliance("a", "", nil, []string{"192.168.0.0/24"}), time.Second)
	r.pass(t)
	if n := cs.lists.Load(); n != 1 {
		t.Errorf("leases listed %d times for a machine with a boot MAC, want 1", n)
	}
	if got := r.s.leases["aa:bb:cc:00:00:99"].String(); got != "192.168.0.9" {
		t.Errorf("boot address %s, want the newest lease's 192.168.0.9", got)
	}
}
