package main

import (
	"testing"

	"github.com/corralhq/corral/internal/imagecache"
)

// TestImageCacheDefault: corral-lab up caches images where `corrald
// images build` does by default (cmd/corrald's TestImagesBuildCacheDefault),
// so one machine builds each image once.
func TestImageCacheDefault(t *testing.T) {
	f := upCmd(new(string)).Flags().Lookup("image-cache")
	if f == nil {
		t.Fatal("up has no --image-cache")
	}
	if want := imagecache.Default(); f.DefValue != want {
		t.Errorf("--image-cache defaults to %q, want the machine-wide %q", f.DefValue, want)
	}
}
