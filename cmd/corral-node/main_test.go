package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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

// TestHypervisorEnv: flags not given come from CORRAL_<FLAG>; the
// command line wins.
func TestHypervisorEnv(t *testing.T) {
	for name, tc := range map[string]struct {
		args    []string
		env     map[string]string
		wantErr string
	}{
		"env join":        {env: map[string]string{"CORRAL_JOIN": "no-port", "CORRAL_CA_CERT": "/nonexistent/ca.crt"}, wantErr: `--join "no-port": want host:port`},
		"flag over env":   {args: []string{"--join", "appliance:20180"}, env: map[string]string{"CORRAL_JOIN": "no-port", "CORRAL_CA_CERT": "/nonexistent/ca.crt"}, wantErr: "--ca-cert: open /nonexistent/ca.crt"},
		"bad env label":   {env: map[string]string{"CORRAL_LABEL": "rack=r1,nokey"}, wantErr: "CORRAL_LABEL"},
		"required flags":  {wantErr: "--join and --ca-cert are required"},
		"unknown env ign": {env: map[string]string{"CORRAL_SOMETHING_ELSE": "x"}, wantErr: "--join and --ca-cert are required"},
	} {
		t.Run(name, func(t *testing.T) {
			for _, k := range []string{"CORRAL_JOIN", "CORRAL_CA_CERT", "CORRAL_LABEL"} {
				t.Setenv(k, "")
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out, errOut bytes.Buffer
			err := run(context.Background(), append([]string{"hypervisor"}, tc.args...), &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("run = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestLabelFlag(t *testing.T) {
	var l labelFlag
	for _, v := range []string{"rack=r1", "zone=a=b", "rack=r2"} {
		if err := l.Set(v); err != nil {
			t.Fatalf("Set(%q): %v", v, err)
		}
	}
	if diff := cmp.Diff(map[string]string{"rack": "r2", "zone": "a=b"}, l.m); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if err := l.Replace([]string{"dc=x"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"dc=x"}, l.GetSlice()); diff != "" {
		t.Errorf("after Replace (-want +got):\n%s", diff)
	}
	if err := l.Set("=v"); err == nil {
		t.Error(`Set("=v") = nil, want an error`)
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
