package ipmi_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/require"
)

func simTarget(b *ipmisim.BMC) ipmi.Target {
	return ipmi.Target{Host: "127.0.0.1", Port: b.Port, Protocol: ipmi.ProtocolIPMI, Username: b.User, Password: b.Pass, Timeout: 10 * time.Second}
}

func nativeOnly() *ipmi.Controller {
	return ipmi.New(ipmi.Config{Providers: []string{ipmi.NativeProviderName}})
}

// waitPower polls until the BMC reports want (power changes are
// asynchronous on ipmi_sim: cycle powers on a second later).
func waitPower(t *testing.T, c *ipmi.Controller, tg ipmi.Target, want ipmi.PowerState, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last ipmi.PowerState
	for time.Now().Before(deadline) {
		st, _, err := c.PowerState(context.Background(), tg)
		if err == nil && st == want {
			return
		}
		last = st
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("power state: want %s within %s, last %s", want, within, last)
}

func TestSimPowerSemantics(t *testing.T) {
	t.Parallel()
	b := ipmisim.Start(t, ipmisim.Options{})
	for _, providers := range [][]string{{ipmi.NativeProviderName}, {ipmi.IpmitoolProviderName}} {
		t.Run(providers[0], func(t *testing.T) {
			if providers[0] == ipmi.IpmitoolProviderName {
				require.Tool(t, "ipmitool")
			}
			c := ipmi.New(ipmi.Config{Providers: providers})
			tg := simTarget(b)
			tg.CipherSuite = 3 // bmclib's ipmitool provider tries 3 then 17 itself
			if providers[0] == ipmi.NativeProviderName {
				tg.CipherSuite = 0 // default: 17 then 3
			}
			ctx := context.Background()
			must := func(a ipmi.Answer, err error) ipmi.Answer {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				if a.Provider != providers[0] {
					t.Fatalf("answered by %q, want %q (%s)", a.Provider, providers[0], a)
				}
				return a
			}
			must(c.SetPower(ctx, tg, ipmi.ActionOff))
			waitPower(t, c, tg, ipmi.PowerOff, 5*time.Second)
			// Off when off: success without touching the machine.
			if a := must(c.SetPower(ctx, tg, ipmi.ActionOff)); a.Note != "already off" {
				t.Fatalf("off when off: note %q", a.Note)
			}
			// Cycle when off powers on.
			if a := must(c.SetPower(ctx, tg, ipmi.ActionCycle)); !strings.Contains(a.Note, "became on") {
				t.Fatalf("cycle when off: note %q", a.Note)
			}
			waitPower(t, c, tg, ipmi.PowerOn, 5*time.Second)
			// On when on: success.
			if a := must(c.SetPower(ctx, tg, ipmi.ActionOn)); a.Note != "already on" {
				t.Fatalf("on when on: note %q", a.Note)
			}
			must(c.SetBootDevice(ctx, tg, ipmi.BootPXE, ipmi.BootOptions{}))
			must(c.SetPower(ctx, tg, ipmi.ActionCycle))
			waitPower(t, c, tg, ipmi.PowerOn, 5*time.Second)
			must(c.SetPower(ctx, tg, ipmi.ActionReset))
			must(c.SetPower(ctx, tg, ipmi.ActionSoftOff))
			waitPower(t, c, tg, ipmi.PowerOff, 5*time.Second)
			rec := strings.Join(b.Record(), "\n")
			for _, want := range []string{"boot pxe", "start boot=pxe", "shutdown 1"} {
				if !strings.Contains(rec, want) {
					t.Errorf("chassis record lacks %q:\n%s", want, rec)
				}
			}
		})
	}
}

func TestSimWrongPassword(t *testing.T) {
	t.Parallel()
	b := ipmisim.Start(t, ipmisim.Options{})
	for _, providers := range [][]string{{ipmi.NativeProviderName}, ipmi.DefaultProviders} {
		t.Run(strings.Join(providers, ","), func(t *testing.T) {
			c := ipmi.New(ipmi.Config{Providers: providers})
			tg := simTarget(b)
			tg.Password = "wrong"
			start := time.Now()
			_, _, err := c.PowerState(context.Background(), tg)
			took := time.Since(start)
			if !errors.Is(err, ipmi.ErrAuth) {
				t.Fatalf("want ErrAuth, got %v", err)
			}
			if !strings.Contains(err.Error(), "authentication failed") {
				t.Fatalf("error does not say authentication failed: %v", err)
			}
			if took > 5*time.Second {
				t.Fatalf("wrong password took %s (want < 5s)", took)
			}
			t.Logf("wrong password: %s: %v", took, err)
		})
	}
	t.Run("wrong user", func(t *testing.T) {
		tg := simTarget(b)
		tg.Username = "nobody"
		_, _, err := nativeOnly().PowerState(context.Background(), tg)
		if !errors.Is(err, ipmi.ErrAuth) {
			t.Fatalf("want ErrAuth, got %v", err)
		}
	})
}

func TestUnreachableAtDeadline(t *testing.T) {
	t.Parallel()
	// A UDP port nobody answers on: bind it and never reply, so the
	// datagrams vanish as they would towards a dead BMC.
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	port := pc.LocalAddr().(*net.UDPAddr).Port
	for name, providers := range map[string][]string{"native": {ipmi.NativeProviderName}, "default": ipmi.DefaultProviders} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := ipmi.New(ipmi.Config{Providers: providers})
			tg := ipmi.Target{Host: "127.0.0.1", Port: port, Protocol: ipmi.ProtocolIPMI, Username: "admin", Password: "x", Timeout: 2 * time.Second}
			start := time.Now()
			_, _, err := c.PowerState(context.Background(), tg)
			took := time.Since(start)
			if !errors.Is(err, ipmi.ErrUnreachable) {
				t.Fatalf("want ErrUnreachable, got %v", err)
			}
			// At the deadline, not later: providers open concurrently,
			// each until the deadline.
			if took > 2500*time.Millisecond || took < 1900*time.Millisecond {
				t.Fatalf("unreachable BMC answered after %s, want at the 2s deadline", took)
			}
			t.Logf("unreachable: %s: %v", took, err)
		})
	}
}

// TestGarbage: a "BMC" that answers every datagram with junk.
func TestGarbage(t *testing.T) {
	t.Parallel()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			junk := []byte("HTTP/1.0 400 nonsense\r\n\r\n")
			if n > 4 {
				junk = append([]byte{0x06, 0x00, 0xff, 0x07}, []byte{0xde, 0xad, 0xbe, 0xef, 0x01}...)
			}
			_, _ = pc.WriteTo(junk, addr)
		}
	}()
	port := pc.LocalAddr().(*net.UDPAddr).Port
	c := nativeOnly()
	tg := ipmi.Target{Host: "127.0.0.1", Port: port, Protocol: ipmi.ProtocolIPMI, Username: "admin", Password: "x", Timeout: 3 * time.Second}
	start := time.Now()
	_, _, err = c.PowerState(context.Background(), tg)
	if err == nil {
		t.Fatal("garbage accepted as an answer")
	}
	if errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("garbage classified as an authentication failure: %v", err)
	}
	if time.Since(start) > 4*time.Second {
		t.Fatalf("garbage took %s", time.Since(start))
	}
	t.Logf("garbage: %v", err)
}

func TestSimInfo(t *testing.T) {
	t.Parallel()
	b := ipmisim.Start(t, ipmisim.Options{})
	info, a, err := nativeOnly().Info(context.Background(), simTarget(b))
	if err != nil || a.Provider != ipmi.NativeProviderName || info.Firmware == "" {
		t.Fatalf("info %+v %s %v", info, a, err)
	}
	t.Logf("ipmi_sim: %+v", info)
}
