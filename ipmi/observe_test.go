package ipmi_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/redfishtest"
	"github.com/google/go-cmp/cmp"
)

// TestObserve: every call is reported with its operation, the provider
// that answered and its outcome (corrald's BMC latency metric).
func TestObserve(t *testing.T) {
	t.Parallel()
	b := ipmisim.Start(t, ipmisim.Options{})
	rf := redfishtest.Start(t, "root", "calvin", b.Machine())
	type call struct{ op, provider, outcome string }
	var mu sync.Mutex
	var got []call
	c := ipmi.New(ipmi.Config{Observe: func(op, provider, outcome string, took time.Duration) {
		if took <= 0 {
			t.Errorf("%s took %s", op, took)
		}
		mu.Lock()
		got = append(got, call{op, provider, outcome})
		mu.Unlock()
	}})
	ctx := context.Background()
	good := redfishTarget(rf)
	if _, _, err := c.PowerState(ctx, good); err != nil {
		t.Fatal(err)
	}
	bad := good
	bad.Password = "wrong"
	c.PowerState(ctx, bad)
	unpinned := good
	unpinned.TLSSHA256 = ""
	c.SetPower(ctx, unpinned, ipmi.ActionOn)

	want := []call{
		{"power-state", ipmi.RedfishProviderName, "ok"},
		{"power-state", "none", "auth"},
		{"power-on", "none", "certificate"},
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(call{})); diff != "" {
		t.Errorf("observed calls (-want +got):\n%s", diff)
	}
}

func TestOutcome(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"nil":         {nil, "ok"},
		"auth":        {ipmi.ErrAuth, "auth"},
		"unreachable": {ipmi.ErrUnreachable, "unreachable"},
		"certificate": {&ipmi.CertificateError{}, "certificate"},
		"protocol":    {ipmi.ErrProtocol, "protocol"},
		"failed":      {ipmi.ErrFailed, "failed"},
		"invalid":     {ipmi.ErrInvalid, "invalid"},
		"other":       {context.Canceled, "other"},
	} {
		if got := ipmi.Outcome(tc.err); got != tc.want {
			t.Errorf("%s: Outcome = %q, want %q", name, got, tc.want)
		}
	}
}
