package inventory

import (
	"math"
	"sort"
	"strconv"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// A selector filters machines by a fact, a label, the zone or the pool:
// KEY OP VALUE, e.g. "memory_bytes>=64Gi", "disk.count>=2",
// "vendor=Dell", "pool=ci", "label.rack=r12". Numeric keys take =, !=, <,
// <=, >, >= and sizes with K/M/G/T (powers of 1000) or Ki/Mi/Gi/Ti
// (powers of 1024) suffixes; text keys take = and !=, compared without
// regard to case, except labels (label.KEY or labels.KEY), which compare
// exactly as label values are stored ("label.KEY=" matches machines
// without the label). One string may hold several selectors separated by
// commas: "pool=ci,zone=a,cpu.cores>=16,disks.count>=2".
type selector struct {
	key, op string
	num     float64
	text    string
	numeric bool
	label   string // the label key of a label selector
}

// labelSelectorPrefixes introduce a label selector's key.
var labelSelectorPrefixes = []string{"label.", "labels."}

var numericKeys = map[string]func(*inventoryv1.Machine) float64{
	"memory_bytes": func(m *inventoryv1.Machine) float64 { return float64(m.GetFacts().GetMemory().GetTotalBytes()) },
	"disk.count":   func(m *inventoryv1.Machine) float64 { return float64(len(m.GetFacts().GetDisks())) },
	"disk.total_bytes": func(m *inventoryv1.Machine) float64 {
		var t uint64
		for _, d := range m.GetFacts().GetDisks() {
			t += d.GetSizeBytes()
		}
		return float64(t)
	},
	"nic.count": func(m *inventoryv1.Machine) float64 { return float64(len(m.GetFacts().GetNics())) },
	// disks and nics (and disks.count, nics.count) are disk.count and
	// nic.count.
	"disks.count": func(m *inventoryv1.Machine) float64 { return float64(len(m.GetFacts().GetDisks())) },
	"nics.count":  func(m *inventoryv1.Machine) float64 { return float64(len(m.GetFacts().GetNics())) },
	"disks":       func(m *inventoryv1.Machine) float64 { return float64(len(m.GetFacts().GetDisks())) },
	"nics":        func(m *inventoryv1.Machine) float64 { return float64(len(m.GetFacts().GetNics())) },
	"cpu.sockets": func(m *inventoryv1.Machine) float64 { return float64(m.GetFacts().GetCpu().GetSockets()) },
	"cpu.cores":   func(m *inventoryv1.Machine) float64 { return float64(m.GetFacts().GetCpu().GetCores()) },
	"cpu.threads": func(m *inventoryv1.Machine) float64 { return float64(m.GetFacts().GetCpu().GetThreads()) },
	"missing_drivers.count": func(m *inventoryv1.Machine) float64 {
		return float64(len(m.GetFacts().GetMissingDrivers()))
	},
}

var textKeys = map[string]func(*inventoryv1.Machine) string{
	"name":             func(m *inventoryv1.Machine) string { return m.GetName() },
	"vendor":           func(m *inventoryv1.Machine) string { return m.GetFacts().GetSystem().GetVendor() },
	"product":          func(m *inventoryv1.Machine) string { return m.GetFacts().GetSystem().GetProduct() },
	"serial":           func(m *inventoryv1.Machine) string { return m.GetSerial() },
	"uuid":             func(m *inventoryv1.Machine) string { return m.GetSystemUuid() },
	"state":            func(m *inventoryv1.Machine) string { return m.GetState().String() },
	"power":            func(m *inventoryv1.Machine) string { return m.GetPowerState().String() },
	"cpu.model":        func(m *inventoryv1.Machine) string { return m.GetFacts().GetCpu().GetModel() },
	"bios.version":     func(m *inventoryv1.Machine) string { return m.GetFacts().GetBios().GetVersion() },
	"baseboard.serial": func(m *inventoryv1.Machine) string { return m.GetFacts().GetBaseboard().GetSerial() },
	"chassis.serial":   func(m *inventoryv1.Machine) string { return m.GetFacts().GetChassis().GetSerial() },
	"zone":             func(m *inventoryv1.Machine) string { return m.GetZone() },
	"pool":             func(m *inventoryv1.Machine) string { return m.GetPool() },
}

// Selectors is a parsed list of selectors; a machine matches when it
// matches every one (an empty list matches every machine).
type Selectors []selector

// MaxSelectors bounds the selectors of one request (after splitting at
// commas), MaxSelectorBytes each one's length.
const (
	MaxSelectors     = 64
	MaxSelectorBytes = 512
)

// ParseSelectors parses KEY OP VALUE selectors, each string one or
// several separated by commas; a malformed one is apierr.ErrInvalid
// naming it and why.
func ParseSelectors(raw []string) (Selectors, error) {
	var out Selectors
	for _, r := range raw {
		for _, part := range strings.Split(r, ",") {
			if strings.TrimSpace(part) == "" && strings.Contains(r, ",") {
				continue // "a=1," or "a=1,,b=2"
			}
			if len(part) > MaxSelectorBytes {
				return nil, apierr.Invalidf("selector %.40q...: longer than %d bytes", part, MaxSelectorBytes)
			}
			if len(out) == MaxSelectors {
				return nil, apierr.Invalidf("more than %d selectors", MaxSelectors)
			}
			sel, err := parseSelector(part)
			if err != nil {
				return nil, err
			}
			out = append(out, sel)
		}
	}
	return out, nil
}

// Match reports whether m matches every selector.
func (ss Selectors) Match(m *inventoryv1.Machine) bool {
	for _, s := range ss {
		if !s.match(m) {
			return false
		}
	}
	return true
}

func parseSelector(s string) (selector, error) {
	s = strings.TrimSpace(s)
	for _, op := range []string{">=", "<=", "!=", "=", ">", "<"} {
		k, v, ok := strings.Cut(s, op)
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		sel := selector{key: k, op: op}
		for _, p := range labelSelectorPrefixes {
			lk, ok := strings.CutPrefix(k, p)
			if !ok {
				continue
			}
			if err := checkLabelKey(lk); err != nil {
				return sel, apierr.Invalidf("selector %q: %v", s, err)
			}
			if op != "=" && op != "!=" {
				return sel, apierr.Invalidf("selector %q: labels are text; use = or !=", s)
			}
			sel.label, sel.text = lk, v
			return sel, nil
		}
		if _, ok := numericKeys[k]; ok {
			n, err := parseQuantity(v)
			if err != nil {
				return sel, apierr.Invalidf("selector %q: %v", s, err)
			}
			sel.num, sel.numeric = n, true
			return sel, nil
		}
		if _, ok := textKeys[k]; ok {
			if op != "=" && op != "!=" {
				return sel, apierr.Invalidf("selector %q: %s is text; use = or !=", s, k)
			}
			sel.text = v
			return sel, nil
		}
		return sel, apierr.Invalidf("selector %q: unknown key %q (numeric: %s; text: %s; labels: label.KEY)", s, k, keyList(numericKeys), keyList(textKeys))
	}
	return selector{}, apierr.Invalidf("selector %q: want KEY OP VALUE with OP one of = != < <= > >=", s)
}

func keyList[V any](m map[string]V) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

// parseQuantity parses a number with an optional size suffix.
func parseQuantity(v string) (float64, error) {
	mult := 1.0
	num := strings.TrimSuffix(v, "B")
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}} {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSuffix(num, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || n < 0 || math.IsInf(n, 0) || math.IsNaN(n) {
		return 0, apierr.Invalidf("%q is not a non-negative number with an optional K/M/G/T or Ki/Mi/Gi/Ti suffix", v)
	}
	return n * mult, nil
}

func (s selector) match(m *inventoryv1.Machine) bool {
	if s.numeric {
		v := numericKeys[s.key](m)
		switch s.op {
		case "=":
			return v == s.num
		case "!=":
			return v != s.num
		case "<":
			return v < s.num
		case "<=":
			return v <= s.num
		case ">":
			return v > s.num
		default:
			return v >= s.num
		}
	}
	var eq bool
	if s.label != "" {
		eq = m.GetLabels()[s.label] == s.text
	} else {
		eq = strings.EqualFold(textKeys[s.key](m), s.text)
	}
	if s.op == "=" {
		return eq
	}
	return !eq
}
