//go:build !corral_discovery

package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/hypervisor/vm"
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

// failingRegistry fails its first n ApplyNode calls.
type failingRegistry struct{ fail int }

func (r *failingRegistry) ApplyNode(_ context.Context, in *poolv1.ApplyNodeRequest, _ ...grpc.CallOption) (*poolv1.Node, error) {
	if r.fail > 0 {
		r.fail--
		return nil, errors.New("appliance unavailable")
	}
	return &poolv1.Node{Name: in.GetName()}, nil
}

// TestFirstApply: the hypervisor boot loads the kvm modules and decides
// the accelerator after the first ApplyNode the appliance accepted (the
// node is READY then), once.
func TestFirstApply(t *testing.T) {
	calls := 0
	r := &firstApply{Registry: &failingRegistry{fail: 2}, then: func() { calls++ }}
	for i, wantCalls := range []int{0, 0, 1, 1} {
		_, err := r.ApplyNode(context.Background(), &poolv1.ApplyNodeRequest{Name: "n1"})
		if (err != nil) != (i < 2) {
			t.Errorf("ApplyNode %d: err = %v", i+1, err)
		}
		if calls != wantCalls {
			t.Errorf("after ApplyNode %d: then called %d times, want %d", i+1, calls, wantCalls)
		}
	}
}

// TestHoldsKVMModules: coldplug holds back exactly the kvm modules.
func TestHoldsKVMModules(t *testing.T) {
	for m, want := range map[string]bool{"kvm": true, "kvm_amd": true, "kvm_intel": true, "virtio_net": false, "kvmgt": false, "ipmi_si": false} {
		if got := isKVMModule(m); got != want {
			t.Errorf("isKVMModule(%q) = %v, want %v", m, got, want)
		}
	}
}

// TestHypervisorBootRefusesBadAccel: the boot's --accel reaches the
// accelerator probe only after the node is READY, so a wrong value is
// refused at once, before hvboot touches the machine.
func TestHypervisorBootRefusesBadAccel(t *testing.T) {
	var out, errs bytes.Buffer
	err := runHypervisorBoot(t.Context(), "/nonexistent/cmdline", t.TempDir(), "kvmm", slog.LevelInfo, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), `accel "kvmm"`) {
		t.Fatalf("runHypervisorBoot(accel kvmm) = %v, want the accel refused", err)
	}
	for _, ok := range []string{"", "auto", "kvm", "tcg"} {
		if err := vm.CheckAccel(ok); err != nil {
			t.Errorf("CheckAccel(%q) = %v", ok, err)
		}
	}
}
