package inventory

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// Label bounds (docs/operator-guide.md, "Labels, zones and pools"): a key
// is an optional DNS-style prefix and '/' and a name; names and values are
// short words, so a label fits a selector and a table cell and never
// holds a comma, a space or a control character.
const (
	MaxLabels           = 64
	MaxLabelNameBytes   = 63
	MaxLabelPrefixBytes = 253
	MaxLabelValueBytes  = 63
)

// The keys LabelMachine takes for the machine's own zone and pool fields.
const (
	ZoneKey = "zone"
	PoolKey = "pool"
)

var (
	labelWordRE   = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$`)
	labelPrefixRE = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?$`)
)

// checkLabelKey validates a label key: [PREFIX/]NAME.
func checkLabelKey(k string) error {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	switch {
	case k == "":
		return apierr.Invalidf("label key is empty")
	case hasPrefix && (prefix == "" || len(prefix) > MaxLabelPrefixBytes || !labelPrefixRE.MatchString(prefix)):
		return apierr.Invalidf("label key %q: the prefix before '/' must be 1-%d lower-case letters, digits, '.' or '-'", clip(k), MaxLabelPrefixBytes)
	case len(name) > MaxLabelNameBytes || !labelWordRE.MatchString(name):
		return apierr.Invalidf("label key %q: the name must be 1-%d letters, digits, '.', '_' or '-', starting and ending with a letter or digit", clip(k), MaxLabelNameBytes)
	}
	return nil
}

// checkLabelValue validates a label value (empty allowed).
func checkLabelValue(k, v string) error {
	if v == "" {
		return nil
	}
	if len(v) > MaxLabelValueBytes || !labelWordRE.MatchString(v) {
		return apierr.Invalidf("label %s: value %q must be empty or 1-%d letters, digits, '.', '_' or '-', starting and ending with a letter or digit", k, clip(v), MaxLabelValueBytes)
	}
	return nil
}

// clip shortens what an error message quotes of a caller's string.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// LabelChange is a LabelMachine request, checked: the labels it sets and
// removes, and the zone and pool when it names them.
type LabelChange struct {
	Set    map[string]string
	Remove []string
}

// check validates the change as a whole.
func (c LabelChange) check() error {
	if len(c.Set)+len(c.Remove) == 0 {
		return apierr.Invalidf("nothing to change: give KEY=VALUE to set or KEY- to remove")
	}
	if len(c.Set)+len(c.Remove) > 2*MaxLabels {
		return apierr.Invalidf("more than %d label changes in one request", 2*MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(c.Set)) {
		v := c.Set[k]
		if err := checkLabelKey(k); err != nil {
			return err
		}
		if err := checkLabelValue(k, v); err != nil {
			return err
		}
		if (k == ZoneKey || k == PoolKey) && v == "" {
			return apierr.Invalidf("%s: an empty %s is no %s: remove it with %s-", k, k, k, k)
		}
		if slices.Contains(c.Remove, k) {
			return apierr.Invalidf("label %s is both set and removed", k)
		}
	}
	for _, k := range c.Remove {
		if err := checkLabelKey(k); err != nil {
			return err
		}
	}
	return nil
}

// apply changes m's labels, zone and pool as c says.
func (c LabelChange) apply(m *inventoryv1.Machine) error {
	for k, v := range c.Set {
		switch k {
		case ZoneKey:
			m.Zone = v
		case PoolKey:
			m.Pool = v
		default:
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels[k] = v
		}
	}
	for _, k := range c.Remove {
		switch k {
		case ZoneKey:
			m.Zone = ""
		case PoolKey:
			m.Pool = ""
		default:
			delete(m.Labels, k)
		}
	}
	if len(m.GetLabels()) > MaxLabels {
		return apierr.Invalidf("machine %q would have %d labels; at most %d", m.GetName(), len(m.GetLabels()), MaxLabels)
	}
	return nil
}

// LabelMachine sets and removes a machine's labels (the keys zone and
// pool set its zone and pool fields) by compare-and-swap on its record,
// and notes the change on its timeline. Bad keys or values, or a key both
// set and removed, are apierr.ErrInvalid and change nothing.
func (i *Inventory) LabelMachine(ctx context.Context, name string, c LabelChange) (*inventoryv1.Machine, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	m, err := i.UpdateMachine(ctx, name, c.apply)
	if err != nil {
		return nil, err
	}
	i.machineEvent(m, "labels", c.String(), nil)
	return m, nil
}

// String describes the change as the CLI takes it: "pool=ci rack- zone=a".
func (c LabelChange) String() string {
	var parts []string
	for k, v := range c.Set {
		parts = append(parts, k+"="+v)
	}
	for _, k := range c.Remove {
		parts = append(parts, k+"-")
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// machineEvent notes an inventory event on m's timeline (by its boot MAC;
// a machine without a MAC gets a log line).
func (i *Inventory) machineEvent(m *inventoryv1.Machine, event, detail string, attrs map[string]string) {
	mac := m.GetBootMac()
	if mac == "" && len(m.GetMacs()) > 0 {
		mac = m.GetMacs()[0]
	}
	if mac == "" {
		i.log.Info(fmt.Sprintf("inventory %s", event), "machine", m.GetName(), "detail", detail)
		return
	}
	i.Event(mac, "inventory", event, detail, attrs)
}
