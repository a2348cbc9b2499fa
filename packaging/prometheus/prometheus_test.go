// Package prometheus_test checks the Prometheus alerting rules and the
// Grafana dashboard shipped in this folder (and in the .deb, under
// /usr/share/corral/prometheus): promtool accepts the rules and their unit
// tests pass, every alert has a test that fires it and one that does not,
// and the dashboard has what Grafana needs with every expression parsed by
// Prometheus's own parser. That every metric they read is one corrald
// exports, and that the expressions run, is checked against a running
// corrald by cmd/corrald's TestE2EMetricsPrometheus.
package prometheus_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/testsupport/promassets"
	"github.com/corralhq/corral/testsupport/require"
	"sigs.k8s.io/yaml"
)

func promtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("promtool", args...)
	cmd.Dir = promassets.Dir()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestAlertRules(t *testing.T) {
	require.Tool(t, "promtool")
	promtool(t, "check", "rules", promassets.RulesFile)
	promtool(t, "test", "rules", promassets.RulesTestFile)

	rf, err := promassets.Rules()
	if err != nil {
		t.Fatal(err)
	}
	// Each alert is tested both ways: an alert_rule_test expecting it and
	// one expecting nothing.
	b, err := os.ReadFile(filepath.Join(promassets.Dir(), promassets.RulesTestFile))
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &tf); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	want := []string{"CorralApplianceDown", "CorralDHCPRangeNearlyExhausted", "CorralMachinesFailed", "CorralNodesNotReady",
		"CorralCertificateExpiringSoon", "CorralLeaderChangingTooOften", "CorralStoreCommitsSlow"}
	have := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			have[r.Alert] = true
			if !fires[r.Alert] {
				t.Errorf("alert %s: no test where it fires", r.Alert)
			}
			if !silent[r.Alert] {
				t.Errorf("alert %s: no test where it stays silent", r.Alert)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: wants a summary and a description", r.Alert)
			}
		}
	}
	for _, a := range want {
		if !have[a] {
			t.Errorf("no alert %s", a)
		}
	}
}

func TestDashboard(t *testing.T) {
	d, err := promassets.ReadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || len(d.UID) > 40 || d.Title == "" || d.SchemaVersion == 0 {
		t.Errorf("dashboard uid %q (1-40 characters), title %q, schemaVersion %d: all are needed", d.UID, d.Title, d.SchemaVersion)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		hasDS = hasDS || (v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus")
	}
	if !hasDS {
		t.Error("no datasource variable of type prometheus: the panels name ${datasource}")
	}
	ids := map[int]bool{}
	targets := 0
	for _, p := range d.AllPanels() {
		if p.ID == 0 || ids[p.ID] {
			t.Errorf("panel %q: id %d missing or used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" || p.Type == "" || p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %d: wants a title, a type and a gridPos within 24 columns", p.ID)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want prometheus ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no targets", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target refId %q missing or repeated, or no expr", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			targets++
		}
	}
	// The sections an operator of the rack looks for.
	for _, m := range []string{"corral_boot_phase_seconds_bucket", "corral_dhcp_range_free_addresses", "corral_dhcp_packets_total",
		"corral_machines", "corral_nodes", "corral_store_commit_seconds_bucket"} {
		found := false
		for _, n := range promassets.MetricNames(d.Exprs()) {
			found = found || n == m
		}
		if !found {
			t.Errorf("the dashboard does not show %s", m)
		}
	}

	// Prometheus's parser: every expression as a recording rule of a rule
	// file promtool checks.
	require.Tool(t, "promtool")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range d.Exprs() {
		q, _ := json.Marshal(e.Expr) // a JSON string is a YAML scalar
		fmt.Fprintf(&rules, "      - record: dashboard:target_%d\n        expr: %s\n", i, q)
	}
	f := filepath.Join(t.TempDir(), "dashboard-exprs.yml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", f)
	t.Logf("%d panels, %d expressions parsed", len(ids), targets)
}
