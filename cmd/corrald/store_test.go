package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// runCorrald runs `corrald ARGS` through cobra in-process and returns its
// standard output.
func runCorrald(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut, func(context.Context, appliance.Config) error {
		return errors.New("serve is not run by this test")
	})
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return strings.TrimSpace(out.String()), err
}

// populate fills a data directory's store through the real inventory,
// pool and token code and record.Put, and returns how many records it
// holds.
func populate(t *testing.T, dataDir string) int {
	t.Helper()
	st, err := appliance.OpenStore(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- inv.Run(ctx) }()
	for i := range 100 {
		mac := fmt.Sprintf("02:00:00:00:%02x:%02x", i/256, i%256)
		if _, _, err := inv.EnsureMachineForMAC(ctx, mac); err != nil {
			t.Fatal(err)
		}
		inv.Event(mac, "dhcp", "discover", "store copy test", map[string]string{"i": strconv.Itoa(i)})
	}
	if err := inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(pool.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if _, err := p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: fmt.Sprintf("hv%02d", i), CpuMilliCores: 16000, MemoryBytes: 64 << 30, StorageBytes: 1 << 40}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.1.0.0/16", Ipv4Gateway: "10.1.0.1"}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: fmt.Sprintf("vm%03d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	tokens := &auth.Tokens{Store: st}
	for i := range 50 {
		if _, err := tokens.Create(ctx, authv1.Role_ROLE_VIEWER, fmt.Sprintf("viewer %d", i), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		bs := &provisioningv1.BlockStorage{Name: fmt.Sprintf("vol%03d", i), RequestBytes: uint64(i) << 20, LimitBytes: uint64(i) << 21,
			State: provisioningv1.BlockStorage_AVAILABLE, NodeName: fmt.Sprintf("hv%02d", i%40), Labels: map[string]string{"team": "t" + strconv.Itoa(i%3)}}
		if _, err := record.Put(ctx, st, "/provisioning/block_storages/"+bs.GetName(), bs, 0); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	all, err := st.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	return len(all)
}

// rec is a store record without its revision, which a copy does not keep.
type rec struct {
	Key   string
	Value []byte
}

// bytesEqual compares values as a whole: go-cmp walks a []byte element by
// element, which takes seconds for a 1.7 MiB value under -race.
var bytesEqual = cmp.Comparer(bytes.Equal)

// snapshot reads every record of a store address (bolt:PATH or etcd://).
func snapshot(t *testing.T, addr string) []rec {
	t.Helper()
	var st store.Store
	prefix := ""
	if p, ok := strings.CutPrefix(addr, "bolt:"); ok {
		b, err := bolt.Open(p, bolt.Options{})
		if err != nil {
			t.Fatalf("snapshot %s: %v", addr, err)
		}
		st = b
	} else {
		eps, pfx, err := etcd.ParseURL(addr)
		if err != nil {
			t.Fatal(err)
		}
		e, err := etcd.Open(context.Background(), etcd.Options{Endpoints: eps, Prefix: pfx})
		if err != nil {
			t.Fatalf("snapshot %s: %v", addr, err)
		}
		st, prefix = e, "/"
	}
	defer st.Close()
	kvs, err := st.List(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	out := []rec{}
	for _, kv := range kvs {
		if kv.Key == "/fleet/secrets" {
			// The sealed CA and seal key copy publishes beside the
			// records (checked on its own).
			continue
		}
		out = append(out, rec{kv.Key, kv.Value})
	}
	return out
}

// etcdAddr is the cluster as a store copy address with prefix.
func etcdAddr(c *etcdtest.Cluster, prefix string) string {
	var hosts []string
	for _, e := range c.Endpoints() {
		hosts = append(hosts, strings.TrimPrefix(e, "http://"))
	}
	return "etcd://" + strings.Join(hosts, ",") + prefix
}

var summaryRE = regexp.MustCompile(`^copied (\d+) records \((\d+) bytes\) from (\S+) to (\S+); verified (\d+) of (\d+); destination revisions (\d+)\.\.(\d+)$`)

// checkSummary parses the summary line and checks what it says.
func checkSummary(t *testing.T, out, from, to string, n int) {
	t.Helper()
	out, _, _ = strings.Cut(out, "\n")
	m := summaryRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("summary %q does not have the documented form", out)
	}
	r1, _ := strconv.ParseInt(m[7], 10, 64)
	r2, _ := strconv.ParseInt(m[8], 10, 64)
	if diff := cmp.Diff([]string{strconv.Itoa(n), from, to, strconv.Itoa(n), strconv.Itoa(n)}, []string{m[1], m[3], m[4], m[5], m[6]}); diff != "" {
		t.Errorf("summary %q (-want +got):\n%s", out, diff)
	}
	if r1 <= 0 || r2-r1 < int64(n-1) {
		t.Errorf("summary %q: revisions %d..%d cannot hold %d strictly increasing revisions", out, r1, r2, n)
	}
}

// TestStoreCopy: a data directory of several hundred records of several
// kinds goes bolt → etcd → bolt with every record identical, and every
// refusal says why and leaves both sides as they were.
func TestStoreCopy(t *testing.T) {
	c := etcdtest.New(t, 3)
	srcDir, backDir := t.TempDir(), t.TempDir()
	n := populate(t, srcDir)
	if n < 300 {
		t.Fatalf("populated only %d records", n)
	}
	src := "bolt:" + filepath.Join(srcDir, appliance.StoreFile)
	mid := etcdAddr(c, "/fleet")
	back := "bolt:" + filepath.Join(backDir, appliance.StoreFile)
	want := snapshot(t, src)

	// The appliance's CA and BMC seal key, kept beside its store file.
	if _, err := pki.EnsureCA(filepath.Join(srcDir, appliance.PKIDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := seal.Ensure(filepath.Join(srcDir, seal.KeyFile)); err != nil {
		t.Fatal(err)
	}

	t.Run("round trip", func(t *testing.T) {
		out, err := runCorrald(t, "store", "copy", "--from", src, "--to", mid)
		if err != nil {
			t.Fatalf("bolt → etcd: %v", err)
		}
		checkSummary(t, out, src, mid, n)
		if !strings.Contains(out, "published the CA and BMC seal key") {
			t.Errorf("bolt → etcd did not publish the CA and seal key: %s", out)
		}
		// The cluster key the copy made goes with the fleet's
		// appliances; here, with the copy back.
		key, err := os.ReadFile(filepath.Join(srcDir, appliance.ClusterKeyFile))
		if err != nil {
			t.Fatalf("cluster key: %v", err)
		}
		if err := os.WriteFile(filepath.Join(backDir, appliance.ClusterKeyFile), key, 0o600); err != nil {
			t.Fatal(err)
		}
		defer func() {
			for _, f := range []string{filepath.Join(appliance.PKIDir, pki.CACertFile), filepath.Join(appliance.PKIDir, pki.CAKeyFile), seal.KeyFile} {
				x, _ := os.ReadFile(filepath.Join(srcDir, f))
				y, err := os.ReadFile(filepath.Join(backDir, f))
				if err != nil || len(x) == 0 || string(x) != string(y) {
					t.Errorf("%s did not round-trip through the fleet's sealed secrets: %v", f, err)
				}
			}
		}()
		if diff := cmp.Diff(want, snapshot(t, mid), bytesEqual); diff != "" {
			t.Fatalf("etcd copy differs (-bolt +etcd):\n%s", diff)
		}
		// A data directory names its store file.
		out, err = runCorrald(t, "store", "copy", "--from", mid, "--to", "bolt:"+backDir)
		if err != nil {
			t.Fatalf("etcd → bolt: %v", err)
		}
		checkSummary(t, out, mid, "bolt:"+backDir, n+1)
		if diff := cmp.Diff(want, snapshot(t, back), bytesEqual); diff != "" {
			t.Fatalf("round trip differs (-original +copy):\n%s", diff)
		}
		// The copy is a store corrald opens: its records decode.
		st, err := appliance.OpenStore(backDir, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		toks, err := (&auth.Tokens{Store: st}).List(context.Background())
		if err != nil || len(toks) < 50 {
			t.Fatalf("tokens in the copy: %d, %v", len(toks), err)
		}
		nodes, err := record.List(context.Background(), st, "/pool/nodes/", func() *poolv1.Node { return &poolv1.Node{} })
		if err != nil || len(nodes) != 40 {
			t.Fatalf("nodes in the copy: %d, %v", len(nodes), err)
		}
	})

	// A store whose last record is too large for etcd's request limit
	// (1.5 MiB): the copy fails at it and removes what it wrote.
	bigDir := t.TempDir()
	nBig := populate(t, bigDir)
	big := "bolt:" + filepath.Join(bigDir, appliance.StoreFile)
	func() {
		st, err := appliance.OpenStore(bigDir, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if _, err := st.Put(context.Background(), "/zz/too-big", bytes.Repeat([]byte{7}, 1700<<10), 0); err != nil {
			t.Fatal(err)
		}
	}()
	unreachable := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return "etcd://" + l.Addr().String() + "/x"
	}()
	lockedDir := t.TempDir()
	populate(t, lockedDir)
	locked := "bolt:" + filepath.Join(lockedDir, appliance.StoreFile)
	absentFile := "bolt:" + filepath.Join(t.TempDir(), "c.db")

	for name, tc := range map[string]struct {
		from, to string
		extra    []string
		lock     string // a bolt file the test holds open during the copy
		class    error
		says     []string
		within   time.Duration // 0: no bound
		// same are stores that must hold what they held before; empty are
		// destinations that must hold nothing (an etcd prefix) or not
		// exist (a bolt file) after the refusal.
		same, empty []string
	}{
		"non-empty etcd destination": {from: back, to: mid, class: apierr.ErrPrecondition, says: []string{"already holds " + strconv.Itoa(n+1) + " records", "prefix /fleet", "neither merges nor overwrites"}, same: []string{back, mid}}, // n records and the fleet's sealed secrets
		"non-empty bolt destination": {from: mid, to: src, class: apierr.ErrPrecondition, says: []string{"already holds " + strconv.Itoa(n) + " records"}, same: []string{mid, src}},
		"bad scheme":                 {from: "postgres://db/corral", to: mid, class: apierr.ErrInvalid, says: []string{"--from", "want bolt:PATH or etcd://"}, same: []string{mid}},
		"plain path":                 {from: filepath.Join(srcDir, appliance.StoreFile), to: mid, class: apierr.ErrInvalid, says: []string{"want bolt:PATH"}, same: []string{src, mid}},
		"empty member":               {from: src, to: "etcd://127.0.0.1:2379,/p", class: apierr.ErrInvalid, says: []string{"empty member address"}, same: []string{src}},
		"bad prefix":                 {from: src, to: "etcd://127.0.0.1:2379/a//", class: apierr.ErrInvalid, says: []string{"prefix"}, same: []string{src}},
		"empty bolt path":            {from: "bolt:", to: mid, class: apierr.ErrInvalid, says: []string{"needs a path"}, same: []string{mid}},
		"missing source file":        {from: "bolt:" + filepath.Join(srcDir, "nope.db"), to: absentFile, class: apierr.ErrNotFound, says: []string{"no store file at", "nope.db"}, empty: []string{"bolt:" + filepath.Join(srcDir, "nope.db"), absentFile}},
		"missing destination dir":    {from: src, to: "bolt:" + filepath.Join(backDir, "no", "such", "corral.db"), class: apierr.ErrNotFound, says: []string{"does not exist"}, same: []string{src}},
		"same file":                  {from: src, to: "bolt:" + srcDir, class: apierr.ErrInvalid, says: []string{"same store file"}, same: []string{src}},
		"locked source":              {from: locked, to: etcdAddr(c, "/locked"), lock: locked, class: apierr.ErrPrecondition, says: []string{"is corrald still running on it?", "locked"}, same: []string{locked}, empty: []string{etcdAddr(c, "/locked")}},
		"locked destination":         {from: mid, to: locked, lock: locked, class: apierr.ErrPrecondition, says: []string{"is corrald still running on it?"}, same: []string{mid, locked}},
		"etcd unreachable":           {from: src, to: unreachable, extra: []string{"--etcd-timeout", "2s"}, class: apierr.ErrUnavailable, says: []string{"did not answer"}, within: 20 * time.Second, same: []string{src}},
		"empty etcd source":          {from: etcdAddr(c, "/nothing"), to: absentFile, class: apierr.ErrPrecondition, says: []string{"holds no records", "prefix /nothing"}, empty: []string{absentFile}},
		"empty etcd source to file":  {from: etcdAddr(c, "/nothing"), to: "bolt:" + backDir, class: apierr.ErrPrecondition, says: []string{"holds no records"}, same: []string{back}},
		"value over etcd's limit":    {from: big, to: etcdAddr(c, "/big"), class: apierr.ErrExhausted, says: []string{`"/zz/too-big"`, "record " + strconv.Itoa(nBig+1) + " of " + strconv.Itoa(nBig+1)}, same: []string{big}, empty: []string{etcdAddr(c, "/big")}},
		"missing flag":               {from: src, class: apierr.ErrInvalid, says: []string{"--from and --to"}, same: []string{src}},
		"zero timeout":               {from: src, to: mid, extra: []string{"--etcd-timeout", "0s"}, class: apierr.ErrInvalid, says: []string{"--etcd-timeout"}, same: []string{src, mid}},
	} {
		t.Run(name, func(t *testing.T) {
			before := map[string][]rec{}
			for _, a := range tc.same {
				before[a] = snapshot(t, a)
			}
			var lock *bolt.Store
			if tc.lock != "" {
				var err error
				if lock, err = bolt.Open(strings.TrimPrefix(tc.lock, "bolt:"), bolt.Options{}); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"store", "copy", "--from", tc.from}
			if tc.to != "" {
				args = append(args, "--to", tc.to)
			}
			start := time.Now()
			out, err := runCorrald(t, append(args, tc.extra...)...)
			took := time.Since(start)
			if lock != nil {
				lock.Close()
			}
			if err == nil {
				t.Fatalf("store copy succeeded: %s", out)
			}
			if !errors.Is(err, tc.class) {
				t.Errorf("error %q is not of class %v", err, tc.class)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if tc.within > 0 && took > tc.within {
				t.Errorf("refused after %s, want within %s", took, tc.within)
			}
			for _, a := range tc.same {
				if diff := cmp.Diff(before[a], snapshot(t, a), bytesEqual); diff != "" {
					t.Errorf("%s changed (-before +after):\n%s", a, diff)
				}
			}
			for _, a := range tc.empty {
				if p, ok := strings.CutPrefix(a, "bolt:"); ok {
					if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("the refused copy left %s behind (%v)", p, err)
					}
				} else if got := snapshot(t, a); len(got) != 0 {
					t.Errorf("the refused copy left %d records in %s", len(got), a)
				}
			}
		})
	}
}
