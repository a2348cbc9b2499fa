// Package promassets reads the Prometheus alerting rules and the Grafana
// dashboard shipped in packaging/prometheus, for the tests that check them
// (packaging/prometheus's promtool tests, cmd/corrald's scrape of a real
// corrald): their PromQL expressions, ready to send to a Prometheus, and
// the metric names they read. Test support only.
package promassets

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// File names inside Dir.
const (
	RulesFile     = "corral-alerts.yml"
	RulesTestFile = "corral-alerts.test.yml"
	DashboardFile = "corral-dashboard.json"
)

// Dir is packaging/prometheus in this checkout.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "packaging", "prometheus")
}

// Expr is one PromQL expression and where it is (an alert's name, a
// dashboard panel's title and target).
type Expr struct {
	Where string
	Expr  string
}

// Rule is one alerting or recording rule.
type Rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// RuleFile is a Prometheus rule file.
type RuleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []Rule `json:"rules"`
	} `json:"groups"`
}

// Rules reads the shipped rule file.
func Rules() (*RuleFile, error) {
	b, err := os.ReadFile(filepath.Join(Dir(), RulesFile))
	if err != nil {
		return nil, err
	}
	var rf RuleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		return nil, fmt.Errorf("%s: %w", RulesFile, err)
	}
	return &rf, nil
}

// Exprs lists the rule file's expressions.
func (rf *RuleFile) Exprs() []Expr {
	var out []Expr
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			out = append(out, Expr{Where: "rule " + r.Alert + r.Record, Expr: r.Expr})
		}
	}
	return out
}

// Dashboard is the part of a Grafana dashboard the checks read.
type Dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []Panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// Panel is one dashboard panel (a row holds none of its own targets).
type Panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []Panel `json:"panels"`
}

// ReadDashboard reads the shipped dashboard.
func ReadDashboard() (*Dashboard, error) {
	b, err := os.ReadFile(filepath.Join(Dir(), DashboardFile))
	if err != nil {
		return nil, err
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	return &d, nil
}

// AllPanels lists the panels, those inside collapsed rows included.
func (d *Dashboard) AllPanels() []Panel {
	var out []Panel
	var walk func(ps []Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// Exprs lists the dashboard's target expressions, with Grafana's
// variables replaced so that Prometheus can run them (Query).
func (d *Dashboard) Exprs() []Expr {
	var out []Expr
	for _, p := range d.AllPanels() {
		for _, t := range p.Targets {
			out = append(out, Expr{Where: fmt.Sprintf("panel %q target %s", p.Title, t.RefID), Expr: Query(t.Expr)})
		}
	}
	return out
}

// Query replaces the Grafana variables a dashboard expression may use
// with values Prometheus accepts.
func Query(expr string) string {
	return strings.NewReplacer("$__rate_interval", "1m", "${__rate_interval}", "1m", "$__interval", "15s", "$__range", "1h").Replace(expr)
}

// nameRE matches the metric names the shipped files may read: corrald's
// own and the process collector's. PromQL functions and label names do
// not start so.
var nameRE = regexp.MustCompile(`\b(?:corral|process)_[a-zA-Z0-9_]+\b`)

// MetricNames lists the series names exprs read (sorted, once each), as
// they appear in /metrics (a histogram's _bucket, _count, _sum).
func MetricNames(exprs []Expr) []string {
	var out []string
	for _, e := range exprs {
		for _, n := range nameRE.FindAllString(e.Expr, -1) {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Exposed reports whether the Prometheus text exposition body has a
// sample of the series name.
func Exposed(body, name string) bool {
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(l, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			return true
		}
	}
	return false
}
