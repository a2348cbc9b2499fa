package vm

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/hypervisor/internal/durable"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"github.com/google/go-cmp/cmp"
)

// TestDeleteIsAllOrNothing: Delete moves the VM directory aside before
// removing it (durable.RemoveAll) and leaves no trace; what a crash left
// in the middle of a delete is never listed and is removed by New.
func TestDeleteIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "vms")
	// A VM that is defined but not running (no QEMU needed), and the
	// remains of a delete a power cut interrupted.
	for path, data := range map[string][]byte{
		filepath.Join(dir, "web", specFile):                              mustJSON(Spec{Name: "web", VCPUs: 1, MemoryBytes: 64 << 20}),
		filepath.Join(dir, "web", desiredFile):                           []byte("shutdown\n"),
		filepath.Join(dir, durable.TrashPrefix+"old-0a1b2c", specFile):   mustJSON(Spec{Name: "old"}),
		filepath.Join(dir, durable.TrashPrefix+"old-0a1b2c", "seed.iso"): []byte("seed"),
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncbuf.Buffer
	m, err := New(ctx, Config{Dir: dir, Accel: "tcg", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "removed deleted vm directories left by a crash") {
		t.Errorf("the sweep was not logged:\n%s", logs.String())
	}
	if diff := cmp.Diff([]string{"web"}, entries(t, dir)); diff != "" {
		t.Errorf("after New (-want +got):\n%s", diff)
	}
	vms, err := m.List(ctx)
	if err != nil || len(vms) != 1 || vms[0].Spec.Name != "web" || vms[0].State != Shutdown {
		t.Fatalf("list: %+v %v", vms, err)
	}
	if _, err := m.Delete(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, dir); len(got) != 0 {
		t.Errorf("left behind: %v", got)
	}
	if _, err := m.Delete(ctx, "web"); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("second delete: %v, want apierr.ErrNotFound", err)
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
