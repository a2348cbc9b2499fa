package inventory

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/termsafe"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// MaxFactString caps each string of a report (bytes). The other ceilings
// bound the caps of FactCaps: corrald refuses a flag set above them.
const (
	MaxFactString = 512
	MaxDisks      = 1024
	MaxNICs       = 512
	MaxPCIDevices = 4096
	MaxDIMMs      = 1024
	MaxFactsBytes = 2 << 20
)

// CheckFacts validates a fact report against DefaultFactCaps: its size
// and lists, every string's length, UTF-8 and control characters (a
// report holding one is refused, naming the field: facts carry the
// identity a report is matched by, which a replacement could make
// collide), and MAC syntax. It never modifies f. Register's check is
// Inventory.CheckReport, with the configured caps.
func CheckFacts(f *inventoryv1.Facts) error { return DefaultFactCaps.Check(f) }

// checkStrings walks every string in m.
func checkStrings(path string, m protoreflect.Message) error {
	var bad error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && bad == nil; i++ {
				bad = checkValue(fmt.Sprintf("%s[%d]", p, i), fd, l.Get(i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if bad = checkString(p+" key", k.String()); bad == nil {
					bad = checkValue(p+"["+k.String()+"]", fd.MapValue(), mv)
				}
				return bad == nil
			})
		default:
			bad = checkValue(p, fd, v)
		}
		return bad == nil
	})
	return bad
}

func checkValue(path string, fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return checkString(path, v.String())
	case protoreflect.MessageKind:
		return checkStrings(path, v.Message())
	default:
		// Numbers, bools, enums and bytes: no limit checked.
		return nil
	}
}

func checkString(path, s string) error {
	if len(s) > MaxFactString {
		return reportErr(RefusedString, "fact %s is %d bytes, limit %d", path, len(s), MaxFactString)
	}
	if !utf8.ValidString(s) {
		return reportErr(RefusedString, "fact %s is not valid UTF-8", path)
	}
	if termsafe.Has(s) {
		return reportErr(RefusedControl, "fact %s holds control characters (%s); the agent escapes them", path, termsafe.Escape(s))
	}
	return nil
}

// factSummary flattens the facts whose changes are worth a history entry.
func factSummary(f *inventoryv1.Facts) map[string]string {
	out := map[string]string{}
	if f == nil {
		return out
	}
	out["cpu.model"] = f.GetCpu().GetModel()
	out["cpu.threads"] = fmt.Sprint(f.GetCpu().GetThreads())
	out["memory.total_bytes"] = fmt.Sprint(f.GetMemory().GetTotalBytes())
	out["memory.dimm_count"] = fmt.Sprint(len(f.GetMemory().GetDimms()))
	out["bios.version"] = f.GetBios().GetVersion()
	out["secure_boot"] = SecureBootText(f)
	for _, d := range f.GetDisks() {
		id := d.GetSerial()
		if id == "" {
			id = d.GetWwn()
		}
		if id == "" {
			id = d.GetName()
		}
		out["disk["+id+"]"] = fmt.Sprintf("%s %d bytes %s", d.GetName(), d.GetSizeBytes(), d.GetModel())
	}
	for _, n := range f.GetNics() {
		if n.GetMac() != "" {
			mac, _ := NormalizeMAC(n.GetMac())
			out["nic["+mac+"]"] = strings.TrimSpace(n.GetName() + " " + n.GetDriver())
		}
	}
	for _, d := range f.GetMemory().GetDimms() {
		if d.GetSerial() != "" {
			out["dimm["+d.GetSerial()+"]"] = fmt.Sprintf("%s %d bytes", d.GetLocator(), d.GetSizeBytes())
		}
	}
	return out
}

// diffFacts returns dated change entries between two reports, sorted by
// path. A first report (old == nil) produces none.
func diffFacts(old, cur *inventoryv1.Facts, at *timestamppb.Timestamp) []*inventoryv1.FactChange {
	if old == nil {
		return nil
	}
	a, b := factSummary(old), factSummary(cur)
	var out []*inventoryv1.FactChange
	for k, v := range b {
		if a[k] != v {
			out = append(out, &inventoryv1.FactChange{At: at, Path: k, Before: a[k], After: v})
		}
	}
	for k, v := range a {
		if _, ok := b[k]; !ok {
			out = append(out, &inventoryv1.FactChange{At: at, Path: k, Before: v, After: ""})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetPath() < out[j].GetPath() })
	return out
}

// SecureBootText is a machine's Secure Boot state as the timeline and
// describe show it: "enabled", "disabled" or "unknown", with the kernel's
// lockdown mode when it said one ("enabled, lockdown integrity").
func SecureBootText(f *inventoryv1.Facts) string {
	s := "unknown"
	switch f.GetSecureBoot() {
	case inventoryv1.Facts_SECURE_BOOT_ENABLED:
		s = "enabled"
	case inventoryv1.Facts_SECURE_BOOT_DISABLED:
		s = "disabled"
	case inventoryv1.Facts_SECURE_BOOT_UNSPECIFIED:
	}
	if l := f.GetLockdown(); l != "" {
		s += ", lockdown " + l
	}
	return s
}
