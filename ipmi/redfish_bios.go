package ipmi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/redfish"
)

// A Redfish BMC's BIOS is its system's Bios resource: Attributes are
// the values in force; @Redfish.Settings names the settings object a
// client PATCHes, whose Attributes are what the BIOS takes at the next
// boot (pending). Keys and values are checked before anything is sent:
// against the AttributeRegistry the Bios names when the BMC serves it
// (type, enumeration values, bounds, length, read-only), otherwise
// against the JSON type of each value read.

// ErrNotRedfish is the error of an operation that needs Redfish on a BMC
// answered only over IPMI (or enrolled for IPMI); nothing was sent.
var ErrNotRedfish = errors.New("BMC is IPMI")

// BIOSAttribute is one BIOS setting.
type BIOSAttribute struct {
	Name string
	// Type is the registry's AttributeType (Enumeration, String,
	// Integer, Boolean, Password), or, without a registry, String,
	// Integer or Boolean after the value read.
	Type string
	// Current is the value in force, Pending the value the next boot
	// applies (HasPending), both as text.
	Current    string
	Pending    string
	HasPending bool
	// Allowed are an Enumeration's values.
	Allowed  []string
	ReadOnly bool
	// Lower and Upper bound an Integer (both 0: none); MaxLength a
	// String (0: none).
	Lower, Upper int64
	MaxLength    int
}

// BIOS is a machine's BIOS settings.
type BIOS struct {
	// Registry is the attribute registry's Id ("" when the BMC names or
	// serves none).
	Registry   string
	Attributes []BIOSAttribute
}

// doRedfish runs f on a gofish client of the session; a BMC that is
// IPMI (by its target's protocol, or because no Redfish session opened)
// is refused with ErrNotRedfish.
func (c *Controller) doRedfish(ctx context.Context, t Target, op, what string, f func(*gofish.APIClient) error) (Answer, error) {
	notRedfish := func() error {
		return fmt.Errorf("%s: %w; %s over Redfish needs a Redfish BMC", t, ErrNotRedfish, what)
	}
	if t.Protocol == ProtocolIPMI {
		return Answer{}, notRedfish()
	}
	none := false
	a, err := c.do(ctx, t, op, func(ctx context.Context, s *session) error {
		if !s.redfishOpen() {
			none = true
			return fmt.Errorf("%w: no Redfish session", ErrFailed)
		}
		return s.redfishCall(ctx, f)
	})
	if none {
		return a, notRedfish()
	}
	return a, err
}

// BIOS reads the BIOS attributes of the BMC's (first) system, with the
// pending settings and what the registry says of each.
func (c *Controller) BIOS(ctx context.Context, t Target) (BIOS, Answer, error) {
	var b BIOS
	a, err := c.doRedfish(ctx, t, "bios-get", "BIOS", func(cl *gofish.APIClient) error {
		var err error
		b, _, err = redfishBIOS(cl)
		return err
	})
	return b, a, err
}

// SetBIOS checks settings (attribute name to value, as text) against
// the BIOS and, when every one is valid, PATCHes them to the settings
// object in one request: pending until the next boot. It returns the
// BIOS read again. An unknown attribute, a read-only one or a value of
// the wrong type is refused with ErrInvalid and nothing is sent.
func (c *Controller) SetBIOS(ctx context.Context, t Target, settings map[string]string) (BIOS, Answer, error) {
	if len(settings) == 0 {
		return BIOS{}, Answer{}, fmt.Errorf("%w: no BIOS settings given", ErrInvalid)
	}
	var b BIOS
	a, err := c.doRedfish(ctx, t, "bios-set", "BIOS", func(cl *gofish.APIClient) error {
		cur, bios, err := redfishBIOS(cl)
		if err != nil {
			return err
		}
		attrs, err := biosValues(cur, settings)
		if err != nil {
			return err
		}
		if err := patchBIOS(cl, bios, attrs); err != nil {
			return err
		}
		b, _, err = redfishBIOS(cl)
		return err
	})
	return b, a, err
}

// patchBIOS PATCHes attrs to the settings object (with the ETag it
// answers, when it has one). Unlike gofish's UpdateBiosAttributes it
// sends a value equal to the current one too: that clears a different
// pending value.
func patchBIOS(cl *gofish.APIClient, bios *redfish.Bios, attrs map[string]any) error {
	target := biosSettingsURI(cl, bios)
	hdr := map[string]string{}
	if resp, err := cl.Get(target); err == nil {
		if tag := resp.Header.Get("ETag"); tag != "" {
			hdr["If-Match"] = tag
		}
		resp.Body.Close()
	}
	resp, err := cl.PatchWithHeaders(target, map[string]any{"Attributes": attrs}, hdr)
	if err != nil {
		return fmt.Errorf("%w: the BMC refused the BIOS settings: %w", ErrFailed, err)
	}
	resp.Body.Close()
	return nil
}

// biosSettingsURI is the Bios's @Redfish.Settings SettingsObject (the
// Bios itself when it names none).
func biosSettingsURI(cl *gofish.APIClient, bios *redfish.Bios) string {
	var raw struct {
		Settings struct {
			SettingsObject struct {
				ID string `json:"@odata.id"`
			}
		} `json:"@Redfish.Settings"`
	}
	if err := getJSON(cl, bios.ODataID, &raw); err == nil && raw.Settings.SettingsObject.ID != "" {
		return raw.Settings.SettingsObject.ID
	}
	return bios.ODataID
}

func firstSystem(cl *gofish.APIClient) (*redfish.ComputerSystem, error) {
	systems, err := cl.Service.Systems()
	if err != nil {
		return nil, err
	}
	if len(systems) == 0 {
		return nil, fmt.Errorf("%w: the BMC lists no system", ErrFailed)
	}
	slices.SortFunc(systems, func(a, b *redfish.ComputerSystem) int { return cmp.Compare(a.ODataID, b.ODataID) })
	return systems[0], nil
}

// redfishBIOS reads the Bios, its pending settings and its registry.
func redfishBIOS(cl *gofish.APIClient) (BIOS, *redfish.Bios, error) {
	sys, err := firstSystem(cl)
	if err != nil {
		return BIOS{}, nil, err
	}
	bios, err := sys.Bios()
	if err != nil {
		return BIOS{}, nil, err
	}
	if bios == nil {
		return BIOS{}, nil, fmt.Errorf("%w: system %s has no Bios resource", ErrFailed, sys.ID)
	}
	var pending map[string]any
	if target := biosSettingsURI(cl, bios); target != bios.ODataID {
		var settings struct{ Attributes map[string]any }
		if err := getJSON(cl, target, &settings); err != nil {
			return BIOS{}, nil, err
		}
		pending = settings.Attributes
	}
	reg := biosRegistry(cl, bios.AttributeRegistry)
	out := BIOS{}
	if reg != nil {
		out.Registry = bios.AttributeRegistry
	}
	for _, name := range slices.Sorted(maps.Keys(bios.Attributes)) {
		v := bios.Attributes[name]
		a := BIOSAttribute{Name: name, Current: valueText(v), Type: typeOf(v)}
		if p, ok := pending[name]; ok && valueText(p) != a.Current {
			a.Pending, a.HasPending = valueText(p), true
		}
		if r, ok := reg[name]; ok {
			a.Type, a.ReadOnly = string(r.Type), r.ReadOnly || r.Immutable
			for _, v := range r.Value {
				a.Allowed = append(a.Allowed, v.ValueName)
			}
			if r.Type == redfish.IntegerAttributeType {
				a.Lower = r.LowerBound
				if r.UpperBound.IsInt64() {
					a.Upper = r.UpperBound.Int64()
				}
			}
			a.MaxLength = int(r.MaxLength)
		}
		out.Attributes = append(out.Attributes, a)
	}
	return out, bios, nil
}

// biosRegistry finds the attribute registry named id among the
// service's Registries (its file's Location); nil when the BMC has none.
func biosRegistry(cl *gofish.APIClient, id string) map[string]redfish.Attribute {
	if id == "" {
		return nil
	}
	files, err := cl.Service.Registries()
	if err != nil {
		return nil
	}
	for _, f := range files {
		if f.ID != id && f.Registry != id && !strings.HasPrefix(id, f.ID+".") {
			continue
		}
		for _, loc := range f.Location {
			if loc.URI == "" {
				continue
			}
			reg, err := redfish.GetAttributeRegistry(cl, loc.URI)
			if err != nil {
				continue
			}
			out := map[string]redfish.Attribute{}
			for _, a := range reg.RegistryEntries.Attributes {
				out[a.AttributeName] = a
			}
			return out
		}
	}
	return nil
}

func typeOf(v any) string {
	switch v.(type) {
	case bool:
		return string(redfish.BooleanAttributeType)
	case float64, int, int64:
		return string(redfish.IntegerAttributeType)
	}
	return string(redfish.StringAttributeType)
}

func valueText(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}

// biosValues turns settings into the values to PATCH, each checked
// against its attribute; every problem is reported at once.
func biosValues(b BIOS, settings map[string]string) (map[string]any, error) {
	out := map[string]any{}
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		text := settings[name]
		i := slices.IndexFunc(b.Attributes, func(a BIOSAttribute) bool { return a.Name == name })
		if i < 0 {
			problems = append(problems, fmt.Sprintf("unknown BIOS attribute %q", name))
			continue
		}
		a := b.Attributes[i]
		v, err := a.parse(text)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		out[name] = v
	}
	if len(problems) > 0 {
		against := "the types of the values read (the BMC offers no attribute registry)"
		if b.Registry != "" {
			against = "attribute registry " + b.Registry
		}
		return nil, fmt.Errorf("%w: %s (checked against %s); nothing was sent", ErrInvalid, strings.Join(problems, "; "), against)
	}
	return out, nil
}

// parse turns text into the attribute's value, or says why it cannot be.
func (a BIOSAttribute) parse(text string) (any, error) {
	if a.ReadOnly {
		return nil, errors.New("read-only")
	}
	switch redfish.AttributeType(a.Type) {
	case redfish.EnumerationAttributeType:
		if len(a.Allowed) > 0 && !slices.Contains(a.Allowed, text) {
			return nil, fmt.Errorf("%q is not one of %s", text, strings.Join(a.Allowed, ", "))
		}
		return text, nil
	case redfish.BooleanAttributeType:
		v, err := strconv.ParseBool(text)
		if err != nil {
			return nil, fmt.Errorf("%q is not a boolean (true or false)", text)
		}
		return v, nil
	case redfish.IntegerAttributeType:
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", text)
		}
		if (a.Lower != 0 || a.Upper != 0) && (v < a.Lower || v > a.Upper) {
			return nil, fmt.Errorf("%d is outside %d..%d", v, a.Lower, a.Upper)
		}
		return v, nil
	default:
		// String, Password, or a type this package does not know: text.
	}
	if a.MaxLength > 0 && len(text) > a.MaxLength {
		return nil, fmt.Errorf("%d characters, at most %d", len(text), a.MaxLength)
	}
	return text, nil
}
