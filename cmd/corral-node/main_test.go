package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	for name, tc := range map[string]struct {
		args    []string
		want    string
		wantErr bool
	}{
		"version":          {args: []string{"version"}, want: "corral-node dev"},
		"no args":          {args: nil, want: "corral-node dev"},
		"unknown":          {args: []string{"frobnicate"}, wantErr: true},
		"bad flag":         {args: []string{"discover", "--nope"}, wantErr: true},
		"dry run on root":  {args: []string{"discover", "--root", "/nonexistent-root", "--dry-run"}, want: "{"},
		"short -v":         {args: []string{"discover", "--root=/nonexistent-root", "--dry-run", "-v"}, want: "{"},
		"single-dash long": {args: []string{"discover", "-root", "/nonexistent-root", "--dry-run"}, wantErr: true},
		"help":             {args: []string{"discover", "--help"}},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errOut)
			if (err != nil) != tc.wantErr {
				t.Fatalf("run(%v) = %v, wantErr %v", tc.args, err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("stdout = %q, want it to contain %q", out.String(), tc.want)
			}
		})
	}
}

// TestHypervisorBootReportsAndRetries: --boot prints why it cannot start
// and keeps retrying until the context ends.
func TestHypervisorBootReportsAndRetries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"hypervisor", "--boot", "--cmdline", "/nonexistent/cmdline", "--data-dir", t.TempDir()}, &out, &errOut)
	if err != nil {
		t.Fatalf("run = %v, want nil when the context ends", err)
	}
	for _, want := range []string{"kernel command line (attempt 1): open /nonexistent/cmdline", "kernel command line (attempt 2)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, out.String())
		}
	}
}
