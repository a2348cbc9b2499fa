package http

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/corralhq/corral/agent/cmdline"
	"github.com/google/go-cmp/cmp"
)

// dnsName is a valid DNS name of n bytes ending in the label tag.
func dnsName(n int, tag string) string {
	var b strings.Builder
	for rem := n - len(tag); rem > 0; {
		c := min(64, rem)
		if rem-c == 1 {
			c--
		}
		b.WriteString(strings.Repeat("p", c-1) + ".")
		rem -= c
	}
	return b.String() + tag
}

// TestScriptEndpoints: corral.endpoint names this appliance first (the
// host iPXE reached), then its peers, each once, valid ones only, at most
// cmdline.MaxEndpoints, and no more than the 2 KiB budget holds; the
// timeline says how many were listed and left out.
func TestScriptEndpoints(t *testing.T) {
	const own = "10.0.0.1:20180"
	var longPeers []string
	for i := range 7 {
		longPeers = append(longPeers, dnsName(253, fmt.Sprintf("a%d", i))+":20180")
	}
	for name, tc := range map[string]struct {
		peers    func(context.Context) []string
		want     []string // nil: check the long-names case by its rules
		wantLeft int
	}{
		"no fleet":      {peers: nil, want: []string{own}},
		"no peers live": {peers: func(context.Context) []string { return nil }, want: []string{own}},
		"own first, order kept": {
			peers: func(context.Context) []string { return []string{"10.0.0.3:20180", "10.0.0.2:20180"} },
			want:  []string{own, "10.0.0.3:20180", "10.0.0.2:20180"},
		},
		"repeats and self once": {
			peers: func(context.Context) []string {
				return []string{"10.0.0.2:20180", own, "10.0.0.2:20180", "b.example:20180", "b.example:20180"}
			},
			want: []string{own, "10.0.0.2:20180", "b.example:20180"},
		},
		"invalid peers left out": {
			peers: func(context.Context) []string {
				return []string{"", "no-port", "10.0.0.2:20180", "x y:1", "a,b:1", "10.0.0.3:0", "c.example:20180"}
			},
			want: []string{own, "10.0.0.2:20180", "c.example:20180"}, wantLeft: 5,
		},
		"bounded to 8": {
			peers: func(context.Context) []string {
				var p []string
				for i := 2; i < 14; i++ {
					p = append(p, fmt.Sprintf("10.0.0.%d:20180", i))
				}
				return p
			},
			want: []string{own, "10.0.0.2:20180", "10.0.0.3:20180", "10.0.0.4:20180", "10.0.0.5:20180",
				"10.0.0.6:20180", "10.0.0.7:20180", "10.0.0.8:20180"},
			wantLeft: 5,
		},
		"cut to the 2 KiB budget": {peers: func(context.Context) []string { return longPeers }},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, func(c *Config) { c.PeerEndpoints = tc.peers })
			resp, body := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:01", nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var kernel string
			for _, l := range strings.Split(string(body), "\n") {
				if strings.HasPrefix(l, "kernel ") {
					kernel = l
				}
			}
			p, err := cmdline.Parse(kernel)
			if err != nil {
				t.Fatalf("the agent would refuse the line: %v\n%s", err, kernel)
			}
			listed, _ := strconv.Atoi(f.rec.attr("52:54:00:00:00:01", "script", "endpoints"))
			left, _ := strconv.Atoi(f.rec.attr("52:54:00:00:00:01", "script", "endpoints_left_out"))
			if tc.want == nil {
				// The long names: own first, as many peers as fit, in order.
				line, _ := strconv.Atoi(f.rec.attr("52:54:00:00:00:01", "script", "cmdline_bytes"))
				if line >= cmdline.MaxLen || line == 0 {
					t.Errorf("kernel command line %d bytes, limit %d", line, cmdline.MaxLen)
				}
				n := len(p.Endpoints)
				if n < 2 || n == 8 || p.Endpoints[0] != own {
					t.Fatalf("endpoints %d (first %q), want own first and some but not all peers", n, p.Endpoints[0])
				}
				if diff := cmp.Diff(longPeers[:n-1], p.Endpoints[1:]); diff != "" {
					t.Errorf("peers listed (-want +got):\n%s", diff)
				}
				if listed != n || left != 8-n {
					t.Errorf("timeline endpoints=%d left_out=%d, want %d and %d", listed, left, n, 8-n)
				}
				t.Logf("7 peers of 253-byte names: %d endpoints listed, %d left out, line %d bytes", n, left, line)
				return
			}
			if diff := cmp.Diff(tc.want, p.Endpoints); diff != "" {
				t.Errorf("corral.endpoint (-want +got):\n%s", diff)
			}
			if len(tc.want) > 1 && listed != len(tc.want) {
				t.Errorf("timeline endpoints=%d, want %d", listed, len(tc.want))
			}
			if left != tc.wantLeft {
				t.Errorf("timeline endpoints_left_out=%d, want %d", left, tc.wantLeft)
			}
		})
	}
}

// TestScriptEndpointsHypervisor: the hypervisor script lists the peers
// too (the node fails over with them) and still carries no token.
func TestScriptEndpointsHypervisor(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.PeerEndpoints = func(context.Context) []string { return []string{"10.0.0.2:20180"} }
	})
	_, body := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:03", nil)
	if !strings.Contains(string(body), "corral.endpoint=10.0.0.1:20180,10.0.0.2:20180 corral.token="+NoToken+" ") {
		t.Errorf("hypervisor script:\n%s", body)
	}
}
