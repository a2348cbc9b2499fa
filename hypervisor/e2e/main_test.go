// Package e2e proves the hypervisor path end to end on real things: corrald
// (in-process) and the built `corral-node hypervisor` in a network
// namespace, QEMU under TCG booting the guest images of
// testsupport/guestimage, driven by the built `corral` CLI running n0stack's
// usecase files (deploy/testdata/usecases). See testsupport/hvlab.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/guestimage"
	"github.com/corralhq/corral/testsupport/hvlab"
	"github.com/corralhq/corral/testsupport/require"
)

var (
	bins     hvlab.Binaries
	buildErr error
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if testing.Short() || hvlab.Skip() != "" {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "corral-hv-e2e-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		start := time.Now()
		bins, buildErr = hvlab.Build(dir, true)
		fmt.Fprintf(os.Stderr, "hypervisor/e2e: built corral-node and corral (-race) in %v\n", time.Since(start).Round(time.Millisecond))
		return m.Run()
	}()
	os.Exit(code)
}

// need skips without root/tools and fails when the build failed.
func need(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: skipped with -short")
	}
	require.Root(t, "network namespaces, taps")
	require.Tool(t, hvlab.Tools...)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

var (
	tinyOnce sync.Once
	tinyImg  *guestimage.Image
	tinyErr  error
)

// tiny returns the tiny guest image (built once per run, cached across
// runs), skipping when a build tool is missing.
func tiny(t *testing.T) string {
	t.Helper()
	require.Tool(t, guestimage.TinyTools...)
	tinyOnce.Do(func() {
		cache, err := guestimage.CacheDir()
		if err != nil {
			tinyErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		start := time.Now()
		tinyImg, tinyErr = guestimage.Tiny(ctx, cache)
		if tinyErr == nil {
			fmt.Fprintf(os.Stderr, "hypervisor/e2e: tiny guest image %s (cached=%v) in %v\n", tinyImg.Path, tinyImg.Cached, time.Since(start).Round(time.Millisecond))
		}
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyImg.Path
}

// usecase reads one of n0stack's usecase files, pointing source_url at
// the lab's web server.
func usecase(t *testing.T, l *hvlab.Lab, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/testdata/usecases/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "http://127.0.0.1:18080/", l.WebURL)
}

// figure logs a measured figure in one greppable form.
func figure(t *testing.T, format string, a ...any) {
	t.Helper()
	t.Logf("FIGURE "+format, a...)
}
