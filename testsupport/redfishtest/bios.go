package redfishtest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
)

// The BIOS, shaped after the Bios schema and DMTF's public mockups:
// Systems/1/Bios holds the current Attributes and names its
// AttributeRegistry; its @Redfish.Settings points at Bios/Settings, the
// settings object a client PATCHes. What is PATCHed stays pending there
// until the system resets (ComputerSystem.Reset other than an off), when
// it becomes current. The registry is found through /redfish/v1/Registries
// (a MessageRegistryFile whose Location names the registry's Uri).

const (
	biosURI          = "/redfish/v1/Systems/1/Bios"
	biosSettingsURI  = "/redfish/v1/Systems/1/Bios/Settings"
	registriesURI    = "/redfish/v1/Registries"
	biosRegistryID   = "BiosAttributeRegistryCT1.v1_0_0"
	biosRegistryFile = "/redfish/v1/Registries/BiosAttributeRegistryCT1"
	biosRegistryURI  = "/redfish/v1/Registries/BiosAttributeRegistryCT1/BiosAttributeRegistryCT1.json"
)

// BIOSAttribute is one attribute of the test BIOS as its registry
// describes it: Type is Enumeration, String, Integer or Boolean.
type BIOSAttribute struct {
	Name      string
	Type      string
	Values    []string // Enumeration's ValueNames
	Lower     int64    // Integer bounds
	Upper     int64
	MaxLength int // String
	ReadOnly  bool
	Value     any // the current value
}

// DefaultBIOS is the test BIOS's attributes.
func DefaultBIOS() []BIOSAttribute {
	return []BIOSAttribute{
		{Name: "BootMode", Type: "Enumeration", Values: []string{"Uefi", "LegacyBios"}, Value: "Uefi"},
		{Name: "ProcVirtualization", Type: "Enumeration", Values: []string{"Enabled", "Disabled"}, Value: "Enabled"},
		{Name: "SriovGlobalEnable", Type: "Boolean", Value: false},
		{Name: "PowerRestoreDelay", Type: "Integer", Lower: 0, Upper: 600, Value: int64(0)},
		{Name: "AssetTag", Type: "String", MaxLength: 32, Value: ""},
		{Name: "SystemSerial", Type: "String", MaxLength: 32, ReadOnly: true, Value: "RF-TEST-1"},
	}
}

type biosState struct {
	attrs   []BIOSAttribute
	pending map[string]any
	// noRegistry: the Bios names no AttributeRegistry (clients check
	// against the types read).
	noRegistry bool
}

func newBIOS() biosState { return biosState{attrs: DefaultBIOS(), pending: map[string]any{}} }

// SetBIOSRegistry says whether the BIOS names its attribute registry
// (the default) or offers none.
func (s *Server) SetBIOSRegistry(offered bool) {
	s.mu.Lock()
	s.bios.noRegistry = !offered
	s.mu.Unlock()
}

// BIOS returns the current attribute values and the pending ones.
func (s *Server) BIOS() (current, pending map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	current = map[string]any{}
	for _, a := range s.bios.attrs {
		current[a.Name] = a.Value
	}
	return current, maps.Clone(s.bios.pending)
}

// applyBIOS makes the pending settings current, as the BIOS does at
// boot. Called with s.mu held.
func (s *Server) applyBIOS() {
	for i := range s.bios.attrs {
		if v, ok := s.bios.pending[s.bios.attrs[i].Name]; ok {
			s.bios.attrs[i].Value = v
		}
	}
	clear(s.bios.pending)
}

// checkBIOS is what the BMC refuses in a settings PATCH (Base
// messages PropertyUnknown, PropertyValueTypeError,
// PropertyValueNotInList, PropertyNotWritable).
func (b *biosState) check(name string, v any) (string, string) {
	i := slices.IndexFunc(b.attrs, func(a BIOSAttribute) bool { return a.Name == name })
	if i < 0 {
		return "Base.1.8.PropertyUnknown", fmt.Sprintf("The property %s is not in the list of valid properties for the resource.", name)
	}
	a := b.attrs[i]
	bad := "Base.1.8.PropertyValueTypeError"
	msg := fmt.Sprintf("The value %v for the property %s is of a different type than the property can accept.", v, name)
	switch a.Type {
	case "Enumeration":
		s, ok := v.(string)
		if !ok {
			return bad, msg
		}
		if !slices.Contains(a.Values, s) {
			return "Base.1.8.PropertyValueNotInList", fmt.Sprintf("The value %s for the property %s is not in the list of acceptable values.", s, name)
		}
	case "String":
		s, ok := v.(string)
		if !ok || (a.MaxLength > 0 && len(s) > a.MaxLength) {
			return bad, msg
		}
	case "Boolean":
		if _, ok := v.(bool); !ok {
			return bad, msg
		}
	case "Integer":
		f, ok := v.(float64)
		if !ok || f != float64(int64(f)) || int64(f) < a.Lower || int64(f) > a.Upper {
			return bad, msg
		}
	}
	if a.ReadOnly {
		return "Base.1.8.PropertyNotWritable", fmt.Sprintf("The property %s is a read only property and cannot be assigned a value.", name)
	}
	return "", ""
}

// serveBIOS answers the Bios, its settings object and the registries;
// false for other paths.
func (s *Server) serveBIOS(w http.ResponseWriter, r *http.Request, path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := &s.bios
	switch {
	case path == biosURI && r.Method == http.MethodGet:
		attrs := map[string]any{}
		for _, a := range b.attrs {
			attrs[a.Name] = a.Value
		}
		body := map[string]any{"@odata.id": biosURI, "@odata.type": "#Bios.v1_1_0.Bios", "Id": "BIOS", "Name": "BIOS Configuration Current Settings",
			"Attributes": attrs,
			"@Redfish.Settings": map[string]any{"@odata.type": "#Settings.v1_3_0.Settings",
				"SettingsObject": map[string]string{"@odata.id": biosSettingsURI}, "SupportedApplyTimes": []string{"OnReset"}},
			"Actions": map[string]any{"#Bios.ResetBios": map[string]string{"target": biosURI + "/Actions/Bios.ResetBios"}}}
		if !b.noRegistry {
			body["AttributeRegistry"] = biosRegistryID
		}
		writeJSON(w, 200, body)
	case path == biosSettingsURI && r.Method == http.MethodGet:
		writeJSON(w, 200, map[string]any{"@odata.id": biosSettingsURI, "@odata.type": "#Bios.v1_1_0.Bios", "Id": "Settings",
			"Name": "BIOS Configuration Pending Settings", "Attributes": maps.Clone(b.pending)})
	case path == biosSettingsURI && r.Method == http.MethodPatch:
		var body struct{ Attributes map[string]any }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Attributes) == 0 {
			redfishError(w, 400, "PATCH wants an Attributes object")
			return true
		}
		for _, k := range slices.Sorted(maps.Keys(body.Attributes)) {
			if code, msg := b.check(k, body.Attributes[k]); code != "" {
				writeJSON(w, 400, map[string]any{"error": map[string]any{"code": "Base.1.8.GeneralError", "message": msg,
					"@Message.ExtendedInfo": []map[string]any{{"MessageId": code, "Message": msg}}}})
				return true
			}
		}
		for k, v := range body.Attributes {
			if f, ok := v.(float64); ok {
				v = int64(f)
			}
			b.pending[k] = v
		}
		w.WriteHeader(http.StatusNoContent)
	case path == registriesURI && r.Method == http.MethodGet && !b.noRegistry:
		writeJSON(w, 200, collection(registriesURI, "#MessageRegistryFileCollection.MessageRegistryFileCollection", biosRegistryFile))
	case path == biosRegistryFile && r.Method == http.MethodGet && !b.noRegistry:
		writeJSON(w, 200, map[string]any{"@odata.id": biosRegistryFile, "@odata.type": "#MessageRegistryFile.v1_1_0.MessageRegistryFile",
			"Id": biosRegistryID, "Name": "BIOS Attribute Registry File", "Registry": biosRegistryID, "Languages": []string{"en"},
			"Location": []map[string]string{{"Language": "en", "Uri": biosRegistryURI}}})
	case path == biosRegistryURI && r.Method == http.MethodGet && !b.noRegistry:
		entries := []map[string]any{}
		for _, a := range b.attrs {
			e := map[string]any{"AttributeName": a.Name, "Type": a.Type, "DisplayName": a.Name, "ReadOnly": a.ReadOnly, "ResetRequired": true}
			switch a.Type {
			case "Enumeration":
				vals := []map[string]string{}
				for _, v := range a.Values {
					vals = append(vals, map[string]string{"ValueName": v, "ValueDisplayName": v})
				}
				e["Value"] = vals
			case "Integer":
				e["LowerBound"], e["UpperBound"] = a.Lower, a.Upper
			case "String":
				e["MaxLength"] = a.MaxLength
			}
			entries = append(entries, e)
		}
		writeJSON(w, 200, map[string]any{"@odata.type": "#AttributeRegistry.v1_3_0.AttributeRegistry", "Id": biosRegistryID,
			"Name": "Corral test BIOS Attribute Registry", "Language": "en", "OwningEntity": "Corral", "RegistryVersion": "1.0.0",
			"RegistryEntries": map[string]any{"Attributes": entries}})
	default:
		return false
	}
	return true
}
