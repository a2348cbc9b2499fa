package inventory

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestBMCRPCsWithoutControl(t *testing.T) {
	inv := newInv(t, Config{})
	s := &MachineServer{Inv: inv}
	_, err := s.GetPower(context.Background(), &inventoryv1.GetPowerRequest{Name: "x"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("%v", err)
	}
}

func TestParseBMCAddress(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1":          "10.0.0.1:0",
		"10.0.0.1:6230":     "10.0.0.1:6230",
		"BMC-1.Example.org": "bmc-1.example.org:0",
		"[fe80::1]:623":     "fe80::1:623",
		"fe80::1":           "fe80::1:0",
		"[fe80::1]":         "fe80::1:0",
	} {
		h, p, err := ParseBMCAddress(in)
		if err != nil || fmt.Sprintf("%s:%d", h, p) != want {
			t.Errorf("%q: %s:%d %v, want %s", in, h, p, err, want)
		}
	}
	for _, in := range []string{"", ":623", "10.0.0.1:", "10.0.0.1:0", "a b", "user@host", "https://h", "0.0.0.0", "224.0.0.1", "-bad-", "h:p"} {
		if _, _, err := ParseBMCAddress(in); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("%q accepted", in)
		}
	}
}

func FuzzParseBMCAddress(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "10.0.0.1:623", "[fe80::1]:623", "fe80::1", "bmc.example.org:443", "", ":", "[", "a:b:c", "http://x/", "999.1.1.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		host, port, err := ParseBMCAddress(s)
		if err != nil {
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("%q: error %v is not apierr.ErrInvalid", s, err)
			}
			return
		}
		if host == "" || port > 65535 {
			t.Fatalf("%q: accepted as %q:%d", s, host, port)
		}
		// What was accepted parses again to the same thing.
		again := host
		if strings.Contains(host, ":") {
			again = "[" + host + "]"
		}
		if port != 0 {
			again += ":" + fmt.Sprint(port)
		}
		h2, p2, err := ParseBMCAddress(again)
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("%q -> %q:%d -> %q:%d %v", s, host, port, h2, p2, err)
		}
	})
}
