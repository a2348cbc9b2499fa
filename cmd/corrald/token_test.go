package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth"
)

// TestTokenCreateOffline: the bootstrap command makes bound and
// single-use tokens and refuses what the API refuses.
func TestTokenCreateOffline(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	corrald := filepath.Join(binDir, "corrald")
	for name, tc := range map[string]struct {
		args []string
		ok   bool
		text string
	}{
		"bound node token":  {[]string{"--role", "node", "--node", "rack1-u7"}, true, ""},
		"single-use viewer": {[]string{"--role", "viewer", "--single-use", "--ttl", "1h"}, true, ""},
		"IP node name":      {[]string{"--role", "node", "--node", "10.0.0.1"}, false, "IP address"},
		"node on a viewer":  {[]string{"--role", "viewer", "--node", "n1"}, false, "only a node token"},
		"single-use agent":  {[]string{"--role", "agent", "--single-use"}, false, "cannot be single-use"},
		"unknown role":      {[]string{"--role", "root"}, false, "want one of"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := runCmd(t, corrald, append([]string{"token", "create", "--data-dir", dataDir}, tc.args...)...)
			if (err == nil) != tc.ok || !strings.Contains(out, tc.text) {
				t.Fatalf("corrald token create %v: %v\n%s", tc.args, err, out)
			}
		})
	}
	st, err := appliance.OpenStore(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := (&auth.Tokens{Store: st}).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var node, viewer *authv1.Token
	for _, r := range recs {
		switch r.GetRole() {
		case authv1.Role_ROLE_NODE:
			node = r
		case authv1.Role_ROLE_VIEWER:
			viewer = r
		default: // any other role fails the count check below
		}
	}
	if len(recs) != 2 || node.GetNode() != "rack1-u7" || !node.GetSingleUse() || !viewer.GetSingleUse() || viewer.GetExpiresUnix() == 0 {
		t.Fatalf("stored tokens %v", recs)
	}
}
