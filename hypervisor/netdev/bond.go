package netdev

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/corralhq/corral/internal/apierr"
)

// aliasBond marks a bond Corral created.
const aliasBond = "corral:bond:"

// Bond modes ApplyBond accepts. Active-backup needs nothing of the switch;
// 802.3ad needs LACP on the switch ports.
const (
	BondActiveBackup = "active-backup"
	Bond8023AD       = "802.3ad"
)

// Bounds of a Bond's configuration.
const (
	MinBondSlaves = 2
	MaxBondSlaves = 8
	MinMiimonMS   = 10
	MaxMiimonMS   = 10000
	// DefaultMiimonMS is the link-check interval when none is given.
	DefaultMiimonMS = 100
)

// Bond is a node uplink bonded over several NICs (the Uplink VLAN
// sub-interfaces then hang off).
type Bond struct {
	// Name of the bond link (at most 15 characters).
	Name string
	// Slaves are the NICs enslaved, 2-8 distinct interface names.
	Slaves []string
	// Mode is BondActiveBackup (default) or Bond8023AD.
	Mode string
	// MiimonMS is the MII link-check interval, 10-10000 ms (default 100).
	MiimonMS int
	// Primary, when set, is the slave active-backup prefers; one of Slaves.
	Primary string
}

// ifname reports whether s is a plausible kernel interface name.
func ifname(s string) bool {
	if s == "" || len(s) > MaxNameLen || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r >= 0x7f || r == '/' || r == ':' || r == ',' || r == '=' {
			return false
		}
	}
	return true
}

// Validate checks b and fills its defaults.
func (b *Bond) Validate() error {
	if !ifname(b.Name) {
		return apierr.Invalidf("bond name %q is not an interface name (1-%d printable characters, no / : , =)", b.Name, MaxNameLen)
	}
	if b.Mode == "" {
		b.Mode = BondActiveBackup
	}
	if b.Mode != BondActiveBackup && b.Mode != Bond8023AD {
		return apierr.Invalidf("bond %s: mode %q: want %s or %s", b.Name, b.Mode, BondActiveBackup, Bond8023AD)
	}
	if b.MiimonMS == 0 {
		b.MiimonMS = DefaultMiimonMS
	}
	if b.MiimonMS < MinMiimonMS || b.MiimonMS > MaxMiimonMS {
		return apierr.Invalidf("bond %s: miimon %d ms out of range %d-%d", b.Name, b.MiimonMS, MinMiimonMS, MaxMiimonMS)
	}
	if n := len(b.Slaves); n < MinBondSlaves || n > MaxBondSlaves {
		return apierr.Invalidf("bond %s: %d slaves, want %d-%d", b.Name, n, MinBondSlaves, MaxBondSlaves)
	}
	seen := map[string]bool{}
	for _, s := range b.Slaves {
		if !ifname(s) {
			return apierr.Invalidf("bond %s: slave %q is not an interface name", b.Name, s)
		}
		if s == b.Name || seen[s] {
			return apierr.Invalidf("bond %s: slave %s named twice (or is the bond)", b.Name, s)
		}
		seen[s] = true
	}
	if b.Primary != "" && !seen[b.Primary] {
		return apierr.Invalidf("bond %s: primary %q is not one of its slaves", b.Name, b.Primary)
	}
	if b.Primary != "" && b.Mode != BondActiveBackup {
		return apierr.Invalidf("bond %s: primary applies to %s only", b.Name, BondActiveBackup)
	}
	return nil
}

// ParseBond reads a bond from its flag form
// "NAME=SLAVE,SLAVE[,mode=MODE][,miimon=MS][,primary=SLAVE]", e.g.
// "bond0=eno1,eno2,mode=active-backup,miimon=100", and validates it.
func ParseBond(s string) (Bond, error) {
	const maxLen = 256
	if len(s) > maxLen {
		return Bond{}, apierr.Invalidf("bond spec longer than %d bytes", maxLen)
	}
	name, rest, ok := strings.Cut(s, "=")
	if !ok {
		return Bond{}, apierr.Invalidf("bond spec %q: want NAME=SLAVE,SLAVE[,mode=M][,miimon=MS][,primary=S]", s)
	}
	b := Bond{Name: name}
	for _, f := range strings.Split(rest, ",") {
		k, v, kv := strings.Cut(f, "=")
		switch {
		case !kv:
			b.Slaves = append(b.Slaves, f)
		case k == "mode":
			b.Mode = v
		case k == "miimon":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return Bond{}, apierr.Invalidf("bond %s: miimon %q is not a positive number of milliseconds", name, v)
			}
			b.MiimonMS = n
		case k == "primary":
			b.Primary = v
		default:
			return Bond{}, apierr.Invalidf("bond %s: unknown option %q (mode, miimon, primary)", name, k)
		}
		if len(b.Slaves) > MaxBondSlaves {
			break
		}
	}
	return b, b.Validate()
}

// BondStatus is a bond as the kernel reports it.
type BondStatus struct {
	Name   string
	Mode   string
	Up     bool
	Active string // the active slave (active-backup); "" when none
	// Slaves maps each slave to whether its link is up (MII status).
	Slaves map[string]bool
}

// ApplyBond creates bond b (or completes one Corral created earlier),
// enslaves its NICs (each brought down to be enslaved, then up) and
// brings it up. A link of that name Corral did not create, or a slave
// enslaved to another master, is refused. A bond created by this call is
// removed again if a later step fails. It is idempotent.
func (m *Manager) ApplyBond(b Bond) error {
	if err := b.Validate(); err != nil {
		return err
	}
	return m.do(func(h *netlink.Handle) error {
		slaves := make([]netlink.Link, len(b.Slaves))
		for i, s := range b.Slaves {
			l, err := h.LinkByName(s)
			if isNotFound(err) {
				return apierr.NotFoundf("bond %s: slave %s does not exist", b.Name, s)
			}
			if err != nil {
				return err
			}
			if strings.HasPrefix(l.Attrs().Alias, "corral:") {
				return apierr.Preconditionf("bond %s: slave %s is a link Corral made", b.Name, s)
			}
			slaves[i] = l
		}
		bond, err := h.LinkByName(b.Name)
		created := false
		switch {
		case isNotFound(err):
			nb := netlink.NewLinkBond(netlink.LinkAttrs{Name: b.Name})
			nb.Mode = netlink.StringToBondMode(b.Mode)
			nb.Miimon = b.MiimonMS
			for i, s := range b.Slaves {
				if s == b.Primary {
					nb.Primary = slaves[i].Attrs().Index
				}
			}
			if err := h.LinkAdd(nb); err != nil {
				return fmt.Errorf("netdev: create bond %s: %w", b.Name, err)
			}
			created = true
			if bond, err = h.LinkByName(b.Name); err != nil {
				_ = h.LinkDel(nb)
				return fmt.Errorf("netdev: bond %s: %w", b.Name, err)
			}
			if err := h.LinkSetAlias(bond, aliasBond+strings.Join(b.Slaves, ",")); err != nil {
				_ = h.LinkDel(bond)
				return fmt.Errorf("netdev: alias bond %s: %w", b.Name, err)
			}
			m.log.Info("bond created", "bond", b.Name, "mode", b.Mode, "miimon_ms", b.MiimonMS, "slaves", strings.Join(b.Slaves, ","))
		case err != nil:
			return fmt.Errorf("netdev: bond %s: %w", b.Name, err)
		case !strings.HasPrefix(bond.Attrs().Alias, aliasBond):
			return apierr.Preconditionf("link %s exists and is not a bond Corral made", b.Name)
		default:
			if have, ok := bond.(*netlink.Bond); ok && have.Mode.String() != b.Mode {
				return apierr.Preconditionf("bond %s exists in mode %s, not %s", b.Name, have.Mode, b.Mode)
			}
		}
		fail := func(err error) error {
			if created {
				_ = h.LinkDel(bond)
			}
			return err
		}
		idx := bond.Attrs().Index
		for _, l := range slaves {
			switch mi := l.Attrs().MasterIndex; {
			case mi == idx:
				continue
			case mi != 0:
				return fail(apierr.Preconditionf("bond %s: slave %s already has another master", b.Name, l.Attrs().Name))
			}
			// The kernel enslaves only links that are down.
			if err := h.LinkSetDown(l); err != nil {
				return fail(fmt.Errorf("netdev: down %s: %w", l.Attrs().Name, err))
			}
			if err := h.LinkSetMasterByIndex(l, idx); err != nil {
				return fail(fmt.Errorf("netdev: enslave %s to %s: %w", l.Attrs().Name, b.Name, err))
			}
		}
		for _, l := range slaves {
			if err := h.LinkSetUp(l); err != nil {
				return fail(fmt.Errorf("netdev: up %s: %w", l.Attrs().Name, err))
			}
		}
		if err := h.LinkSetUp(bond); err != nil {
			return fail(fmt.Errorf("netdev: up %s: %w", b.Name, err))
		}
		return nil
	})
}

// BondStatus reports bond name: mode, active slave and each slave's link.
func (m *Manager) BondStatus(name string) (BondStatus, error) {
	var st BondStatus
	err := m.do(func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if isNotFound(err) {
			return apierr.NotFoundf("no bond %s", name)
		}
		if err != nil {
			return err
		}
		b, ok := l.(*netlink.Bond)
		if !ok {
			return apierr.Preconditionf("link %s is not a bond", name)
		}
		st = BondStatus{Name: name, Mode: b.Mode.String(), Up: b.Attrs().Flags&net.FlagUp != 0, Slaves: map[string]bool{}}
		links, err := linkList(h)
		if err != nil {
			return err
		}
		for _, s := range links {
			a := s.Attrs()
			if a.MasterIndex != b.Index || a.Slave == nil {
				continue
			}
			bs, ok := a.Slave.(*netlink.BondSlave)
			if !ok {
				continue
			}
			st.Slaves[a.Name] = bs.MiiStatus == netlink.BondLinkUp
			if bs.State == netlink.BondStateActive && b.Mode == netlink.BOND_MODE_ACTIVE_BACKUP {
				st.Active = a.Name
			}
		}
		return nil
	})
	return st, err
}

// DeleteBond removes a bond Corral created (its slaves are released by
// the kernel); a missing bond is not an error.
func (m *Manager) DeleteBond(name string) error {
	if !ifname(name) {
		return apierr.Invalidf("bond name %q", name)
	}
	return m.deleteOwned(name, aliasBond, "bond", "a bond Corral made")
}
