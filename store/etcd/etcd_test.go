package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

var prefixSeq atomic.Int64

// openOn opens a store on c under a prefix of its own, so every open is an
// empty store on the one cluster.
func openOn(t *testing.T, c *etcdtest.Cluster, prefix string) *Store {
	t.Helper()
	if prefix == "" {
		prefix = fmt.Sprintf("/t%d", prefixSeq.Add(1))
	}
	s, err := Open(context.Background(), Options{Endpoints: c.Endpoints(), Prefix: prefix, RequestTimeout: 3 * time.Second})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// TestContract runs the contract suite on one member: its 50-writer
// contention cases spin on compare-and-swap, and replication adds nothing
// to what they check. The three-member behaviour (two appliances, quorum
// loss and return, elections) has tests of its own below.
func TestContract(t *testing.T) {
	c := etcdtest.New(t, 1)
	storetest.Run(t, func(t *testing.T) store.Store { return openOn(t, c, "") })
}

// TestTwoClientsOneFleet: two stores (two appliances) on one prefix see each
// other's writes and conflict on the same revisions.
func TestTwoClientsOneFleet(t *testing.T) {
	c := etcdtest.New(t, 3)
	a := openOn(t, c, "/fleet")
	b := openOn(t, c, "/fleet")
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	ch, err := b.Watch(ctx, "/m/")
	if err != nil {
		t.Fatal(err)
	}
	rev, err := a.Put(ctx, "/m/x", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := b.Get(ctx, "/m/x")
	if err != nil || kv.Revision != rev || string(kv.Value) != "1" {
		t.Fatalf("b.Get = %+v, %v; want 1 at %d", kv, err, rev)
	}
	if _, err := b.Put(ctx, "/m/x", []byte("2"), rev); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, "/m/x", []byte("3"), rev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale Put through a = %v, want ErrConflict", err)
	}
	select {
	case ev := <-ch:
		if ev.KV.Key != "/m/x" || string(ev.KV.Value) != "1" {
			t.Fatalf("watch event %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event on the other appliance")
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		in     string
		eps    []string
		prefix string
		bad    bool
	}{
		{in: "etcd://127.0.0.1:2379", eps: []string{"http://127.0.0.1:2379"}, prefix: "/corral"},
		{in: "etcd://a:1,b:2/site-b", eps: []string{"http://a:1", "http://b:2"}, prefix: "/site-b"},
		{in: "etcd+https://a:1/x/y/", eps: []string{"https://a:1"}, prefix: "/x/y"},
		{in: "bolt:/tmp/x", bad: true},
		{in: "etcd://", bad: true},
		{in: "etcd://a:1,,b:2", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			eps, prefix, err := ParseURL(tc.in)
			if tc.bad {
				if !errors.Is(err, apierr.ErrInvalid) {
					t.Fatalf("err = %v, want invalid", err)
				}
				return
			}
			if err != nil || fmt.Sprint(eps) != fmt.Sprint(tc.eps) || prefix != tc.prefix {
				t.Fatalf("= %v %q %v, want %v %q", eps, prefix, err, tc.eps, tc.prefix)
			}
		})
	}
}

func TestOptionsRefused(t *testing.T) {
	for name, o := range map[string]Options{
		"no endpoints":  {},
		"bad scheme":    {Endpoints: []string{"unix:///x"}},
		"bad prefix":    {Endpoints: []string{"http://127.0.0.1:1"}, Prefix: "corral"},
		"trailing /":    {Endpoints: []string{"http://127.0.0.1:1"}, Prefix: "/corral/"},
		"cert, no key":  {Endpoints: []string{"http://127.0.0.1:1"}, CertFile: "/x"},
		"missing CA":    {Endpoints: []string{"https://127.0.0.1:1"}, CAFile: "/nonexistent/ca.pem"},
		"missing certs": {Endpoints: []string{"https://127.0.0.1:1"}, CertFile: "/nonexistent/c", KeyFile: "/nonexistent/k"},
		"in flight < 4": {Endpoints: []string{"http://127.0.0.1:1"}, MaxInFlight: 3},
		"in flight < 0": {Endpoints: []string{"http://127.0.0.1:1"}, MaxInFlight: -1},
		"queued < 0":    {Endpoints: []string{"http://127.0.0.1:1"}, MaxQueued: -1},
		"wait < 0":      {Endpoints: []string{"http://127.0.0.1:1"}, AdmitWait: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Open(context.Background(), o)
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("Open = %v, want an invalid-argument error", err)
			}
		})
	}
}

// TestNoMember: a cluster that is not there fails Open with Unavailable
// within the dial timeout.
func TestNoMember(t *testing.T) {
	start := time.Now()
	_, err := Open(context.Background(), Options{Endpoints: []string{"http://127.0.0.1:1"}, DialTimeout: time.Second})
	if !errors.Is(err, apierr.ErrUnavailable) {
		t.Fatalf("Open = %v, want Unavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Open took %s", d)
	}
}

// TestQuorum: with one of three members killed every write still commits;
// with two killed requests fail with Unavailable within the request timeout
// and nothing half-written remains; when they return the store serves again
// and holds every acknowledged write.
func TestQuorum(t *testing.T) {
	c := etcdtest.New(t, 3)
	s := openOn(t, c, "/q")
	defer s.Close()
	ctx := context.Background()
	acked := map[string]int64{}
	put := func(k string) error {
		rev, err := s.Put(ctx, k, []byte(k), 0)
		if err == nil {
			acked[k] = rev
		}
		return err
	}
	for i := range 10 {
		if err := put(fmt.Sprintf("/k/a%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Kill(2)
	// A write in flight while the members elect a new leader may time out
	// (etcd answers "request timed out, possibly due to previous leader
	// failure": not acknowledged, so not lost). Once a leader is elected,
	// two of three members commit every write.
	if err := c.WaitHealthy(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := put(fmt.Sprintf("/k/b%02d", i)); err != nil {
			t.Fatalf("with one member down: %v", err)
		}
	}
	c.Kill(1)
	start := time.Now()
	err := put("/k/lost")
	if !errors.Is(err, apierr.ErrUnavailable) {
		t.Fatalf("Put without quorum = %v, want Unavailable", err)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("Put without quorum took %s", d)
	}
	if _, err := s.Get(ctx, "/k/a00"); !errors.Is(err, apierr.ErrUnavailable) {
		t.Fatalf("Get without quorum = %v, want Unavailable", err)
	}
	t.Logf("without quorum: %v", err)
	for _, i := range []int{1, 2} {
		if err := c.StartMember(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	kvs, err := s.List(ctx, "/k/")
	if err != nil {
		t.Fatalf("List after recovery: %v", err)
	}
	got := map[string]int64{}
	for _, kv := range kvs {
		got[kv.Key] = kv.Revision
	}
	for k, rev := range acked {
		if got[k] != rev {
			t.Errorf("%s: revision %d after recovery, acknowledged at %d", k, got[k], rev)
		}
	}
	// The unacknowledged write may or may not have committed (etcd
	// decides); it is never half there.
	if rev, ok := got["/k/lost"]; ok {
		kv, err := s.Get(ctx, "/k/lost")
		if err != nil || string(kv.Value) != "/k/lost" || kv.Revision != rev {
			t.Errorf("unacknowledged write half there: %+v %v", kv, err)
		}
	}
	if err := put("/k/after"); err != nil {
		t.Fatalf("Put after recovery: %v", err)
	}
}

// TestListPages: a listing longer than one page is complete and ordered.
func TestListPages(t *testing.T) {
	c := etcdtest.New(t, 1)
	s := openOn(t, c, "")
	defer s.Close()
	ctx := context.Background()
	n := listPage*2 + 17
	for i := range n {
		if _, err := s.Put(ctx, fmt.Sprintf("/p/%06d", i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	kvs, err := s.List(ctx, "/p/")
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != n {
		t.Fatalf("List = %d records, want %d", len(kvs), n)
	}
	for i, kv := range kvs {
		if want := fmt.Sprintf("/p/%06d", i); kv.Key != want {
			t.Fatalf("record %d = %s, want %s", i, kv.Key, want)
		}
	}
}

// TestPrefixesApart: a fleet under /corral never sees the records of a
// fleet under /corralx, not even when listing everything.
func TestPrefixesApart(t *testing.T) {
	c := etcdtest.New(t, 1)
	a := openOn(t, c, "/corral")
	b := openOn(t, c, "/corralx")
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	if _, err := b.Put(ctx, "/k", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "k", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "/", "k"} {
		kvs, err := a.List(ctx, p)
		if err != nil || len(kvs) != 0 {
			t.Errorf("List(%q) under /corral = %v, %v; want nothing of /corralx", p, kvs, err)
		}
	}
	if _, err := a.Get(ctx, "/k"); err == nil {
		t.Error("Get under /corral found /corralx's record")
	}
	// A transaction compares and writes its own fleet's keys only.
	if _, err := a.Txn(ctx, []store.Op{{Kind: store.OpCheck, Key: "/k"}, {Kind: store.OpPut, Key: "k", Value: []byte("a")}}); err != nil {
		t.Errorf("Txn under /corral creating k beside /corralx's k: %v", err)
	}
	if kv, err := b.Get(ctx, "k"); err != nil || string(kv.Value) != "x" {
		t.Errorf("/corralx's k after /corral's Txn = %+v, %v", kv, err)
	}
}
