package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/corralhq/corral/store"
)

// RunPager runs the contract of store.Pager against the stores open
// returns (which must implement it).
func RunPager(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	for name, fn := range map[string]func(t *testing.T, s store.Pager, st store.Store){
		"Pages":      testPages,
		"Bounds":     testPageBounds,
		"Concurrent": testPagesConcurrent,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			t.Cleanup(func() { _ = s.Close() })
			p, ok := store.AsPager(s)
			if !ok {
				t.Fatalf("%T does not implement store.Pager", s)
			}
			fn(t, p, s)
		})
	}
}

func keysOf(kvs []store.KV) []string {
	out := make([]string, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, kv.Key)
	}
	return out
}

// walk reads every page of prefix, size at a time.
func walk(t *testing.T, p store.Pager, prefix string, size int) []string {
	t.Helper()
	var got []string
	after := ""
	for range 100000 {
		kvs, _, err := p.ListPage(ctxFor(t), prefix, after, size)
		if err != nil {
			t.Fatalf("ListPage(%q, %q, %d): %v", prefix, after, size, err)
		}
		if len(kvs) > size {
			t.Fatalf("ListPage(%q, %q, %d) returned %d records", prefix, after, size, len(kvs))
		}
		if len(kvs) == 0 {
			return got
		}
		got = append(got, keysOf(kvs)...)
		after = kvs[len(kvs)-1].Key
	}
	t.Fatal("paging did not end")
	return nil
}

func testPages(t *testing.T, p store.Pager, s store.Store) {
	ctx := ctxFor(t)
	var want []string
	for i := range 10 {
		k := fmt.Sprintf("page/k%02d", i)
		mustPut(t, s, k, "v"+k, 0)
		want = append(want, k)
	}
	for _, k := range []string{"pag", "page", "pagf/x", "paga/x"} {
		mustPut(t, s, k, "out", 0)
	}
	for _, size := range []int{1, 3, 10, 11, 1000} {
		if got := walk(t, p, "page/", size); !slices.Equal(got, want) {
			t.Errorf("pages of %d: %v, want %v", size, got, want)
		}
	}
	// Values and revisions are those Get returns; the revision is the
	// store's at the time of the read.
	kvs, rev, err := p.ListPage(ctx, "page/", "", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		g, err := s.Get(ctx, kv.Key)
		if err != nil || string(g.Value) != string(kv.Value) || g.Revision != kv.Revision {
			t.Errorf("page record %q = %q@%d, Get = %q@%d (%v)", kv.Key, kv.Value, kv.Revision, g.Value, g.Revision, err)
		}
		kv.Value[0] = 'X' // a copy: the store is unchanged
	}
	wantKV(t, s, kvs[0].Key, "v"+kvs[0].Key, kvs[0].Revision)
	if h, ok := store.AsHistoryWatcher(s); ok {
		cur, err := h.Revision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Other writers may share the store (one etcd cluster): the page's
		// revision is at least its records' and at most the store's now.
		if rev > cur || rev < max(kvs[0].Revision, kvs[1].Revision) {
			t.Errorf("ListPage revision %d, records at %d and %d, store revision %d", rev, kvs[0].Revision, kvs[1].Revision, cur)
		}
	}
	// A deleted record is not listed; one created after the position is.
	k03, err := s.Get(ctx, "page/k03")
	if err != nil {
		t.Fatal(err)
	}
	mustDelete(t, s, "page/k03", k03.Revision)
	mustPut(t, s, "page/k035", "new", 0)
	got := walk(t, p, "page/", 3)
	want = slices.DeleteFunc(slices.Clone(want), func(k string) bool { return k == "page/k03" })
	want = slices.Insert(want, 3, "page/k035")
	if !slices.Equal(got, want) {
		t.Errorf("after a delete and a create: %v, want %v", got, want)
	}
}

func testPageBounds(t *testing.T, p store.Pager, s store.Store) {
	ctx := ctxFor(t)
	for _, k := range []string{"b/1", "b/2", "b/3", "a/1", "c/1"} {
		mustPut(t, s, k, k, 0)
	}
	for name, tc := range map[string]struct {
		after string
		want  []string
	}{
		"first":          {"", []string{"b/1", "b/2", "b/3"}},
		"before prefix":  {"a/9", []string{"b/1", "b/2", "b/3"}},
		"after one":      {"b/1", []string{"b/2", "b/3"}},
		"between keys":   {"b/15", []string{"b/2", "b/3"}},
		"after the last": {"b/3", nil},
		"after prefix":   {"c/0", nil},
	} {
		kvs, _, err := p.ListPage(ctx, "b/", tc.after, 10)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := keysOf(kvs); !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("%s: ListPage(b/, %q) = %v, want %v", name, tc.after, got, tc.want)
		}
	}
	if kvs, _, err := p.ListPage(ctx, "none/", "", 5); err != nil || len(kvs) != 0 {
		t.Errorf("empty prefix: %v, %v", kvs, err)
	}
}

// testPagesConcurrent: while other records under the prefix are created
// and deleted, every record present throughout is listed exactly once.
func testPagesConcurrent(t *testing.T, p store.Pager, s store.Store) {
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	var stable []string
	for i := range 60 {
		k := fmt.Sprintf("m/%03d", i*2)
		mustPut(t, s, k, "x", 0)
		stable = append(stable, k)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ctx.Err() == nil; n++ {
			k := fmt.Sprintf("m/%03d", (n%60)*2+1)
			rev, err := s.Put(ctx, k, []byte("y"), 0)
			if err != nil {
				return
			}
			if err := s.Delete(ctx, k, rev); err != nil {
				return
			}
		}
	}()
	for range 5 {
		got := walk(t, p, "m/", 7)
		seen := map[string]int{}
		for _, k := range got {
			seen[k]++
		}
		for _, k := range stable {
			if seen[k] != 1 {
				t.Errorf("record %q listed %d times", k, seen[k])
			}
		}
		for k, n := range seen {
			if n != 1 {
				t.Errorf("record %q listed %d times", k, n)
			}
		}
	}
	cancel()
	wg.Wait()
}
