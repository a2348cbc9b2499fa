package main

import (
	"testing"

	"github.com/corralhq/corral/internal/imagecache"
)

// TestImagesBuildCacheDefault: `corrald images build` caches in the
// machine-wide image cache corral-lab uses too (cmd/corral-lab's
// TestImageCacheDefault checks the other side), not per data directory.
func TestImagesBuildCacheDefault(t *testing.T) {
	img := newImagesCmd(&globals{})
	build, _, err := img.Find([]string{"build"})
	if err != nil {
		t.Fatal(err)
	}
	f := build.Flags().Lookup("image-cache")
	if f == nil {
		t.Fatal("images build has no --image-cache")
	}
	if want := imagecache.Default(); f.DefValue != want {
		t.Errorf("--image-cache defaults to %q, want the machine-wide %q", f.DefValue, want)
	}
}
