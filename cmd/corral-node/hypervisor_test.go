//go:build !corral_discovery

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHypervisorEnv: flags not given come from CORRAL_<FLAG>; the
// command line wins.
func TestHypervisorEnv(t *testing.T) {
	for name, tc := range map[string]struct {
		args    []string
		env     map[string]string
		wantErr string
	}{
		"env join":        {env: map[string]string{"CORRAL_JOIN": "no-port", "CORRAL_CA_CERT": "/nonexistent/ca.crt"}, wantErr: `--join: "no-port" refused: element 1: "no-port": want host:port`},
		"env join list":   {env: map[string]string{"CORRAL_JOIN": "a:1,,b:2", "CORRAL_CA_CERT": "/nonexistent/ca.crt"}, wantErr: `--join: "a:1,,b:2" refused: element 2: empty`},
		"join list":       {args: []string{"--join", "a:1,b:2"}, env: map[string]string{"CORRAL_CA_CERT": "/nonexistent/ca.crt"}, wantErr: "--ca-cert: open /nonexistent/ca.crt"},
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
