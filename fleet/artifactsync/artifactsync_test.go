package artifactsync

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// TestCatalogEntries: the manifest keeps the first content published per
// name; a record that does not name a valid artifact is skipped.
func TestCatalogEntries(t *testing.T) {
	st := mem.New()
	defer st.Close()
	discard := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	k1 := images.Artifact{Name: "vmlinuz", Kind: images.KindKernel, Size: 10, SHA256: hexSum([]byte("one"))}
	k2 := k1
	k2.SHA256 = hexSum([]byte("two"))
	ipxe := images.Artifact{Name: "undionly.kpxe", Kind: images.KindIPXE, Size: 3, SHA256: hexSum([]byte("ipxe"))}
	pub, err := publishCatalog(ctx, st, []images.Artifact{k1, ipxe}, "a", discard)
	if err != nil || !cmp.Equal(pub, []string{"vmlinuz"}) {
		t.Fatalf("publish = %v, %v; want vmlinuz only", pub, err)
	}
	if pub, err := publishCatalog(ctx, st, []images.Artifact{k2}, "b", discard); err != nil || len(pub) != 0 {
		t.Fatalf("second publish = %v, %v; want nothing", pub, err)
	}
	for key, v := range map[string]map[string]any{
		CatalogPrefix + "bad-sum":   {"name": "bad-sum", "size": 1.0, "sha256": "xyz"},
		CatalogPrefix + "traverse":  {"name": "../traverse", "size": 1.0, "sha256": hexSum(nil)},
		CatalogPrefix + "frac":      {"name": "frac", "size": 1.5, "sha256": hexSum(nil)},
		CatalogPrefix + "elsewhere": {"name": "vmlinuz", "size": 1.0, "sha256": hexSum(nil)},
	} {
		s, _ := structpb.NewStruct(v)
		b, err := record.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Put(ctx, key, b, 0); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readCatalog(ctx, st, discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]images.Artifact{k1}, got); diff != "" {
		t.Errorf("catalog (-want +got):\n%s", diff)
	}
}

// TestServeArtifactChangedOnDisk: a file whose content is no longer the
// hash it is held under ends the stream with DataLoss, not success.
func TestServeArtifactChangedOnDisk(t *testing.T) {
	dir := t.TempDir()
	body := randomBytes(t, ChunkSize+1)
	a, err := images.Receive(dir, images.Artifact{Name: "vmlinuz", Size: int64(len(body)), SHA256: hexSum(body)}, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	collect := func(c *fleetv1.ArtifactChunk) error { got = append(got, c.GetData()...); return nil }
	if err := serveArtifact(dir, a.SHA256, collect); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("serve intact: %d bytes, %v", len(got), err)
	}
	if err := os.WriteFile(a.Path, bytes.ToUpper(body), 0o644); err != nil {
		t.Fatal(err)
	}
	got = nil
	if err := serveArtifact(dir, a.SHA256, collect); !errors.Is(err, apierr.ErrDataLoss) || !strings.Contains(err.Error(), "no longer has sha256") {
		t.Errorf("serve changed file: %v", err)
	}
	if err := os.Truncate(a.Path, 10); err != nil {
		t.Fatal(err)
	}
	if err := serveArtifact(dir, a.SHA256, collect); !errors.Is(err, apierr.ErrDataLoss) {
		t.Errorf("serve truncated file: %v", err)
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
