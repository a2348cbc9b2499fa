package bmc

import (
	"context"
	"errors"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeConsoles answers SerialConsoleSSH with sc.
type fakeConsoles struct {
	sc    SerialConsoleSSH
	calls int
}

func (f *fakeConsoles) SerialConsoleSSH(context.Context, Target) (SerialConsoleSSH, Result, error) {
	f.calls++
	return f.sc, Result{Provider: RedfishProviderName}, nil
}

// TestConsoleTargetTransport: an IPMI BMC (and an AUTO one answered over
// IPMI) keeps Serial-over-LAN; a Redfish BMC is SSH; without a console
// reader a Redfish BMC is refused; no BMC is contacted.
func TestConsoleTargetTransport(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		req      *inventoryv1.EnrollMachineRequest
		noTLS    bool
		readers  bool
		want     ConsoleTransport
		wantErr  error
		wantPort uint32
	}{
		"ipmi": {req: enrollReq("m", "10.0.4.1", "pw"), readers: true, want: ConsoleSOL, wantPort: 623},
		"auto answered ipmi": {req: func() *inventoryv1.EnrollMachineRequest {
			r := redfishReq("m", "10.0.4.1:623", "pw")
			r.BmcProtocol = 0
			return r
		}(), noTLS: true, readers: true, want: ConsoleSOL, wantPort: 623},
		"redfish":             {req: redfishReq("m", "10.0.4.1:443", "pw"), readers: true, want: ConsoleRedfishSSH, wantPort: 443},
		"redfish, no readers": {req: redfishReq("m", "10.0.4.1:443", "pw"), wantErr: apierr.ErrPrecondition},
	} {
		t.Run(name, func(t *testing.T) {
			_, c, f := newBMCControl(t)
			addr := tc.req.GetBmcAddress()
			if !strings.Contains(addr, ":") {
				addr += ":623"
			}
			f.password[addr] = "pw"
			if !tc.noTLS && tc.req.GetBmcProtocol() != inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI {
				f.cert[addr] = certA
			}
			if tc.readers {
				c.cfg.Consoles = &fakeConsoles{}
			}
			if _, err := c.Enroll(ctx, tc.req); err != nil {
				t.Fatal(err)
			}
			calls := f.calls
			con, err := c.ConsoleTarget(ctx, "m")
			if f.calls != calls {
				t.Fatal("ConsoleTarget contacted the BMC")
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("want %v, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil || con.Transport != tc.want || con.Port != tc.wantPort || con.Password != "pw" {
				t.Fatalf("got %v %+v, want %v on port %d", err, con, tc.want, tc.wantPort)
			}
		})
	}
}

// TestConsoleHostKeyPin: the first key is pinned by CAS, the same key
// again is nothing, another is a HostKeyError and the pin stays; a
// refusal flags the machine and refuses its console (naming both keys and
// forget-hostkey) until ForgetConsoleHostKey; enrolling again at the same
// address keeps the pin, at another clears it.
func TestConsoleHostKeyPin(t *testing.T) {
	ctx := context.Background()
	const addr, k1, k2 = "10.0.4.2:443", "SHA256:one", "SHA256:two"
	inv, c, f := newBMCControl(t)
	f.password[addr], f.cert[addr] = "pw", certA
	c.cfg.Consoles = &fakeConsoles{}
	req := redfishReq("m", addr, "pw")
	req.BootMac = "52:54:00:00:04:02"
	if _, err := c.Enroll(ctx, req); err != nil {
		t.Fatal(err)
	}
	con, err := c.ConsoleTarget(ctx, "m")
	if err != nil || con.HostKey != "" {
		t.Fatalf("before the first link: %v %q", err, con.HostKey)
	}
	pin := func() string {
		m, err := inv.GetMachine(ctx, "m")
		if err != nil {
			t.Fatal(err)
		}
		return m.GetBmc().GetConsoleHostKey()
	}
	if err := c.PinConsoleHostKey(ctx, "m", con, k1); err != nil || pin() != k1 {
		t.Fatalf("first use: %v, pin %q", err, pin())
	}
	if err := c.PinConsoleHostKey(ctx, "m", con, k1); err != nil {
		t.Fatalf("the same key again: %v", err)
	}
	var he *HostKeyError
	if err := c.PinConsoleHostKey(ctx, "m", con, k2); !errors.As(err, &he) || he.Pinned != k1 || he.Presented != k2 || pin() != k1 {
		t.Fatalf("another key (a concurrent pin): %v, pin %q", err, pin())
	}
	c.NoteConsoleHostKeyRefused(ctx, "m", k1, k2)
	_, err = c.ConsoleTarget(ctx, "m")
	st := apierr.ToStatus(err)
	if !errors.Is(err, ErrHostKey) || status.Code(st) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), k1) || !strings.Contains(err.Error(), k2) || !strings.Contains(err.Error(), "corral machine bmc forget-hostkey m") {
		t.Fatalf("console while refused: %v", st)
	}
	if _, err := c.Enroll(ctx, req); err != nil {
		t.Fatal(err)
	}
	if m, _ := inv.GetMachine(ctx, "m"); pin() != k1 || flagWith(m.GetFlags(), FlagConsoleHostKeyChanged) == "" {
		t.Fatalf("enrolled again at the same address: pin %q flags %q", pin(), m.GetFlags())
	}
	if _, _, err := c.ForgetConsoleHostKey(ctx, "m", k2); !errors.Is(err, apierr.ErrPrecondition) || pin() != k1 {
		t.Fatalf("forget expecting another key: %v, pin %q", err, pin())
	}
	m, was, err := c.ForgetConsoleHostKey(ctx, "m", k1)
	if err != nil || was != k1 || m.GetBmc().GetConsoleHostKey() != "" || flagWith(m.GetFlags(), FlagConsoleHostKeyChanged) != "" {
		t.Fatalf("forget: %v was %q, %+v", err, was, m)
	}
	if con, err = c.ConsoleTarget(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if err := c.PinConsoleHostKey(ctx, "m", con, k2); err != nil || pin() != k2 {
		t.Fatalf("pin after forget: %v %q", err, pin())
	}
	const other = "10.0.4.3:443"
	f.password[other], f.cert[other] = "pw", certA
	req.BmcAddress = other
	if _, err := c.Enroll(ctx, req); err != nil {
		t.Fatal(err)
	}
	if pin() != "" {
		t.Fatalf("enrolled at another address: the old BMC's pin %q kept", pin())
	}
	// A link of the old address's target cannot pin onto the new BMC.
	if err := c.PinConsoleHostKey(ctx, "m", con, k1); !errors.Is(err, apierr.ErrPrecondition) || pin() != "" {
		t.Fatalf("pin by a stale target: %v, pin %q", err, pin())
	}
}

// TestSSHConsoleDisabled: a BMC that reports its SSH console disabled
// is a clear precondition; an enabled one is returned as read.
func TestSSHConsoleDisabled(t *testing.T) {
	ctx := context.Background()
	const addr = "10.0.4.4:443"
	_, c, f := newBMCControl(t)
	f.password[addr], f.cert[addr] = "pw", certA
	fc := &fakeConsoles{sc: SerialConsoleSSH{Source: "system", Port: 2200}}
	c.cfg.Consoles = fc
	if _, err := c.Enroll(ctx, redfishReq("m", addr, "pw")); err != nil {
		t.Fatal(err)
	}
	con, err := c.ConsoleTarget(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SSHConsole(ctx, "m", con); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "SerialConsole.SSH.ServiceEnabled is false") {
		t.Fatalf("disabled: %v", err)
	}
	fc.sc.Enabled = true
	if sc, err := c.SSHConsole(ctx, "m", con); err != nil || sc.Port != 2200 {
		t.Fatalf("enabled: %v %+v", err, sc)
	}
}
