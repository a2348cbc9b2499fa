package auth

import (
	"testing"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/google/go-cmp/cmp"
)

func TestAllowedMatrix(t *testing.T) {
	const (
		viewer   = authv1.Role_ROLE_VIEWER
		user     = authv1.Role_ROLE_USER
		operator = authv1.Role_ROLE_OPERATOR
		admin    = authv1.Role_ROLE_ADMIN
		node     = authv1.Role_ROLE_NODE
		agent    = authv1.Role_ROLE_AGENT
	)
	methods := map[string]*authv1.Access{
		"viewer":               {Role: viewer},
		"user":                 {Role: user},
		"operator":             {Role: operator},
		"admin":                {Role: admin},
		"viewer+node":          {Role: viewer, Also: []authv1.Role{node}},
		"operator+node":        {Role: operator, Also: []authv1.Role{node}},
		"admin+agent":          {Role: admin, Also: []authv1.Role{agent}},
		"admin+agent+node":     {Role: admin, Also: []authv1.Role{agent, node}},
		"no option":            nil,
		"unspecified role":     {},
		"unspecified+node":     {Also: []authv1.Role{node}},
		"viewer in also (ign)": {Role: admin, Also: []authv1.Role{viewer}},
	}
	principals := map[string]authv1.Role{
		"VIEWER":      viewer,
		"USER":        user,
		"OPERATOR":    operator,
		"ADMIN":       admin,
		"NODE":        node,
		"AGENT":       agent,
		"UNSPECIFIED": authv1.Role_ROLE_UNSPECIFIED,
		"unknown(9)":  authv1.Role(9),
	}
	// want[principal] lists the methods it may call; all others are denied.
	want := map[string]map[string]bool{
		"VIEWER":   {"viewer": true, "viewer+node": true},
		"USER":     {"viewer": true, "user": true, "viewer+node": true},
		"OPERATOR": {"viewer": true, "user": true, "operator": true, "viewer+node": true, "operator+node": true},
		"ADMIN": {"viewer": true, "user": true, "operator": true, "admin": true, "viewer+node": true, "operator+node": true,
			"admin+agent": true, "admin+agent+node": true, "no option": true, "unspecified role": true,
			"unspecified+node": true, "viewer in also (ign)": true},
		"NODE":        {"viewer+node": true, "operator+node": true, "admin+agent+node": true, "unspecified+node": true},
		"AGENT":       {"admin+agent": true, "admin+agent+node": true},
		"UNSPECIFIED": {},
		"unknown(9)":  {},
	}
	got := map[string]map[string]bool{}
	for pname, role := range principals {
		got[pname] = map[string]bool{}
		for mname, a := range methods {
			if Allowed(Principal{Role: role, ID: "0123456789abcdef"}, a) {
				got[pname][mname] = true
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Allowed matrix (-want +got):\n%s", diff)
	}
}
