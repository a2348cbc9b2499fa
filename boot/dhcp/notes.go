package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/store"
)

func (s *Server) event(mac, event, detail string, attrs map[string]string) {
	s.cfg.Timeline.Event(mac, "dhcp", event, detail, attrs)
}

// eventN records an entry whose attributes are n's (its map is built
// here, for the entry: most packets record none).
func (s *Server) eventN(mac, event, detail string, n *note) {
	s.event(mac, event, detail, n.attrs())
}

// note collects what a packet's timeline entries say about the client.
// Its attribute map is built only when an entry is written: most packets
// (a plain client's DISCOVER and REQUEST) write none, and then nothing is
// formatted for them. set keeps at most len(kv) keys (the call sites set
// at most six).
type note struct {
	c     *Client
	m     *dhcpv4.DHCPv4
	rng   Range
	hasR  bool
	ip    netip.Addr
	hasIP bool
	kv    [8]struct{ k, v string }
	n     int
}

func newNote(c *Client, m *dhcpv4.DHCPv4) *note { return &note{c: c, m: m} }

// set sets attribute k to v.
func (n *note) set(k, v string) {
	for i := range n.n {
		if n.kv[i].k == k {
			n.kv[i].v = v
			return
		}
	}
	if n.n < len(n.kv) {
		n.kv[n.n].k, n.kv[n.n].v = k, v
		n.n++
	}
}

// get returns attribute k as set ("" if not).
func (n *note) get(k string) string {
	for i := range n.n {
		if n.kv[i].k == k {
			return n.kv[i].v
		}
	}
	return ""
}

// setRange and setIP set "range" and "ip", formatted only for an entry.
func (n *note) setRange(r Range)    { n.rng, n.hasR = r, true }
func (n *note) setIP(ip netip.Addr) { n.ip, n.hasIP = ip, true }

// attrs is the attribute map of an entry: the client's, then what was set.
func (n *note) attrs() map[string]string {
	a := clientAttrs(*n.c, n.m)
	if n.hasR {
		a["range"] = n.rng.String()
	}
	if n.hasIP {
		a["ip"] = n.ip.String()
	}
	for _, e := range n.kv[:n.n] {
		a[e.k] = e.v
	}
	return a
}

// clientAttrs describes the client for the timeline. Options 60 and 77
// are the client's to choose: their control characters are escaped here
// (internal/termsafe), as the timeline does again for anything it stores.
// maxClassShown bounds option 60 as the timeline shows it: one option's
// worth (255 bytes). A client may send the option several times, which
// the decoder concatenates (RFC 3396), up to a packet's size.
const maxClassShown = 255

func clientAttrs(c Client, m *dhcpv4.DHCPv4) map[string]string {
	a := map[string]string{"xid": m.TransactionID.String()}
	if c.HasArch {
		a["arch"] = strconv.Itoa(int(c.Arch))
		a["arch_name"] = c.Arch.String()
	}
	if c.VendorClass != "" {
		a["vendor_class"] = termsafe.Bounded(c.VendorClass, maxClassShown)
	}
	if c.IPXE {
		a["ipxe"] = "true"
	}
	if uc := m.UserClass(); len(uc) > 0 {
		a["user_class"] = termsafe.Escape(strings.Join(uc, ","))
	}
	if g := addrOf(m.GatewayIPAddr); g.IsValid() {
		a["relay"] = g.String()
	}
	return a
}

// identify makes sure a network-booting client has a machine and puts
// its name and boot intent in attrs for the timeline: one inventory call,
// whose record gives both (a known machine's packet reads its record
// once). It returns false
// when inventory refused to record a new machine (the discovered-machine
// cap): the client then gets no boot file.
func (s *Server) identify(ctx context.Context, c Client, attrs *note) bool {
	ok, _ := s.identifyBusy(ctx, c, attrs)
	return ok
}

// identifyBusy is identify that also says whether the machine went
// unrecorded only because the store is busy (saturated, or no answer in
// time): then nothing is wrong with the client, and a moment later its
// record will be written.
func (s *Server) identifyBusy(ctx context.Context, c Client, attrs *note) (recorded, busy bool) {
	if !c.NetBoot() {
		return true, false
	}
	m, created, err := s.cfg.Inventory.EnsureMachineForMAC(ctx, c.MAC)
	if storeBusy(err) {
		attrs.set("inventory_error", err.Error())
		return true, true
	}
	if errors.Is(err, apierr.ErrExhausted) {
		s.warn.Warn(logDiscoveredCap, "unknown network-booting MAC not recorded: no boot file for it", "mac", c.MAC, "err", err)
		attrs.set("inventory_error", err.Error())
		return false, false
	}
	if err != nil {
		s.warn.Warn(logInventory, "inventory: cannot ensure machine", "mac", c.MAC, "err", err)
		attrs.set("inventory_error", err.Error())
		return true, false
	}
	attrs.set("machine", m.GetName())
	if created {
		attrs.set("new_machine", "true")
	}
	attrs.set("intent", intentLabel(bootIntent(m)))
	return true, false
}

// storeBusy reports whether err is the store refusing for saturation or
// not answering in time.
func storeBusy(err error) bool {
	return errors.Is(err, store.ErrBusy) || errors.Is(err, apierr.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// bootIntent is what m boots, derived from the record EnsureMachineForMAC
// returned (no second read) by inventory.BootIntent's rule: a machine in
// MAINTENANCE boots its local disk, an unset intent means discovery.
// TestIntentMatchesInventory keeps the two in step. It labels the
// timeline only: boot/http decides what the machine boots.
func bootIntent(m *inventoryv1.Machine) inventoryv1.BootIntent {
	switch {
	case m.GetState() == inventoryv1.Machine_MAINTENANCE:
		return inventoryv1.BootIntent_BOOT_INTENT_LOCAL
	case m.GetBootIntent() == inventoryv1.BootIntent_BOOT_INTENT_UNSPECIFIED:
		return inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
	}
	return m.GetBootIntent()
}

// intentLabel is an intent as the timeline's "intent" attribute says it:
// its name without the prefix, in lower case.
func intentLabel(i inventoryv1.BootIntent) string {
	switch i {
	case inventoryv1.BootIntent_BOOT_INTENT_DISCOVER:
		return "discover"
	case inventoryv1.BootIntent_BOOT_INTENT_LOCAL:
		return "local"
	case inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR:
		return "hypervisor"
	default:
		// UNSPECIFIED, and any intent added later: its own name, below.
	}
	return strings.ToLower(strings.TrimPrefix(i.String(), "BOOT_INTENT_"))
}

// unrecorded is the boot choice for a network-booting client inventory
// would not record.
func unrecorded(attrs *note) Boot {
	return Boot{Kind: BootNone, Reason: "not booted: " + attrs.get("inventory_error")}
}

func bootAttrs(attrs map[string]string, b Boot) map[string]string {
	attrs["boot"] = string(b.Kind)
	if b.File != "" {
		attrs["file"] = b.File
	}
	if b.Echo60 != "" {
		attrs["echo_vendor_class"] = b.Echo60
	}
	return attrs
}

func describe(what string, c Client) string {
	var parts []string
	if c.HasArch {
		parts = append(parts, fmt.Sprintf("arch %d (%s)", uint16(c.Arch), c.Arch.String()))
	}
	if c.VendorClass != "" {
		parts = append(parts, "vendor class "+strconv.Quote(termsafe.Bounded(c.VendorClass, maxClassShown)))
	}
	if c.IPXE {
		parts = append(parts, "iPXE")
	}
	if len(parts) == 0 {
		parts = append(parts, "no PXE options")
	}
	return what + ": " + strings.Join(parts, ", ")
}
