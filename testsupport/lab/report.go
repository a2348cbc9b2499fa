package lab

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// Boot is one network boot of a machine reconstructed from its timeline:
// the times of its milestones (zero when the timeline lacks one).
type Boot struct {
	Intent     string    // the rendered script's intent: discover, hypervisor, ...
	Power      time.Time // the BMC power action (or the lab's own power on) that started it
	DHCP       time.Time // first DHCP DISCOVER
	Script     time.Time // iPXE script rendered
	Kernel     time.Time // kernel served
	Initrd     time.Time // last initrd served
	Agent      time.Time // first entry from the booted system (agent registered, node, install progress)
	AgentEvent string
	Last       time.Time // last entry of the boot
	LastEvent  string
	// Ready is when the node was reported READY in the timeline, if it was.
	Ready time.Time
}

// bootSources are the sources of entries written while firmware and iPXE
// boot; anything else comes from the booted system or the appliance.
var bootSources = map[string]bool{"dhcp": true, "tftp": true, "http": true, "ra": true}

// Boots splits a timeline (oldest first) into boots: a DHCP DISCOVER after
// a boot got its script starts the next one, and so does the lifecycle's
// kexec into the hypervisor image. poweredAt, when not zero, is
// the lab's own power on, used when no BMC entry precedes the first boot.
func Boots(es []*inventoryv1.TimelineEntry, poweredAt time.Time) []Boot {
	var boots []Boot
	var cur *Boot
	var pendingPower time.Time
	// prefetched: kernel or initrd served after a boot's agent started:
	// the agent fetching the hypervisor image ahead of its kexec, while
	// it installs (lifecycle kexecAhead).
	var prefetched bool
	for _, e := range es {
		at := e.GetAt().AsTime()
		src, ev := e.GetSource(), e.GetEvent()
		if isPowerAction(e) {
			pendingPower = at
		}
		if src == "lifecycle" && ev == "kexec" {
			// The install's kexec into the hypervisor image: a boot
			// without firmware, DHCP or script; the kexec command stands
			// for its power-on and its script (lifecycle/kexec.go).
			boots = append(boots, Boot{Intent: "hypervisor/kexec", Power: at, Script: at, Last: at, LastEvent: src + " " + ev})
			cur = &boots[len(boots)-1]
			if prefetched {
				// Fetched (and loaded) before the kexec: there at once.
				cur.Kernel, cur.Initrd = at, at
			}
			pendingPower, prefetched = time.Time{}, false
			continue
		}
		if src == "dhcp" && ev == "discover" && (cur == nil || !cur.Script.IsZero()) {
			boots = append(boots, Boot{DHCP: at, Power: pendingPower})
			cur = &boots[len(boots)-1]
			pendingPower = time.Time{}
		}
		if cur == nil {
			continue
		}
		switch {
		case src == "http" && ev == "script":
			if cur.Script.IsZero() {
				cur.Script = at
				cur.Intent = e.GetAttributes()["intent"]
			}
		case src == "http" && ev == "artifact" && !cur.Agent.IsZero():
			prefetched = true // not this boot's: the next one's, ahead of its kexec
		case src == "http" && ev == "artifact":
			switch e.GetAttributes()["kind"] {
			case "kernel":
				cur.Kernel = at
			case "initrd":
				cur.Initrd = at
			}
		case !bootSources[src] && src != "bmc" && !isPowerAction(e):
			if cur.Agent.IsZero() && !cur.Script.IsZero() {
				cur.Agent, cur.AgentEvent = at, src+" "+ev
			}
		}
		if isReady(e) && cur.Ready.IsZero() {
			cur.Ready = at
		}
		// The power poller's observations lag the boot: not its last step.
		if !cur.Script.IsZero() && !(src == "bmc" && ev == "power-changed") {
			cur.Last, cur.LastEvent = at, src+" "+ev
		}
	}
	if len(boots) > 0 && boots[0].Power.IsZero() && !poweredAt.IsZero() && poweredAt.Before(boots[0].DHCP) {
		boots[0].Power = poweredAt
	}
	return boots
}

// isPowerAction reports an entry for a power action that starts a boot:
// a BMC power on/cycle/reset, the lifecycle's or the watchdog's power
// cycle, or a reboot command to the agent. The poller's power-changed
// observations lag and are not actions.
func isPowerAction(e *inventoryv1.TimelineEntry) bool {
	ev := e.GetEvent()
	switch e.GetSource() {
	case "bmc":
		return ev == "power-on" || ev == "power-cycle" || ev == "power-reset"
	case "lifecycle", "watchdog":
		return ev == "power-cycle" || ev == "reboot"
	}
	return false
}

// isReady reports the entry saying the machine's node is READY.
func isReady(e *inventoryv1.TimelineEntry) bool {
	return e.GetSource() == "lifecycle" && e.GetEvent() == "deployed"
}

// span formats b-a, "-" when either is unknown.
func span(a, b time.Time) string {
	if a.IsZero() || b.IsZero() || b.Before(a) {
		return "-"
	}
	return fmt.Sprintf("%.1fs", b.Sub(a).Seconds())
}

func firstNonZero(ts ...time.Time) time.Time {
	for _, t := range ts {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

// MachineFigures are one machine's boots and milestones, read from
// corrald's timeline.
type MachineFigures struct {
	Name, Firmware string
	Boots          []Boot
	// Power is the start of the first boot (its power action, else its
	// first DHCP DISCOVER); Inventoried, Installed and Ready are the first
	// `inventory registered`, `lifecycle installed` and `lifecycle
	// deployed` entries (zero when the timeline lacks them).
	Power, Inventoried, Installed, Ready time.Time
	State, Node                          string
}

// Measure reads every lab machine's timeline and returns its figures, in
// the state file's order.
func Measure(ctx context.Context, dir string) ([]MachineFigures, error) {
	s, err := LoadState(dir)
	if err != nil {
		return nil, err
	}
	a, err := dialAPI(s)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	snap, err := a.snapshot(ctx, s)
	if err != nil {
		return nil, err
	}
	var out []MachineFigures
	for _, lm := range s.Machines {
		v := snap[lm.Name]
		es, err := a.timeline(ctx, lm, v, 2000)
		if err != nil {
			return nil, err
		}
		out = append(out, figures(lm, v, es))
	}
	return out, nil
}

// figures makes lm's figures from its timeline es (oldest first).
func figures(lm Machine, v view, es []*inventoryv1.TimelineEntry) MachineFigures {
	m := MachineFigures{Name: lm.Name, Firmware: lm.Firmware, Boots: Boots(es, lm.PoweredAt), State: v.State(), Node: v.NodeState()}
	if len(m.Boots) > 0 {
		m.Power = firstNonZero(m.Boots[0].Power, m.Boots[0].DHCP)
	}
	for _, e := range es {
		at := e.GetAt().AsTime()
		switch {
		case m.Inventoried.IsZero() && e.GetSource() == "inventory" && e.GetEvent() == "registered":
			m.Inventoried = at
		case m.Installed.IsZero() && e.GetSource() == "lifecycle" && e.GetEvent() == "installed":
			m.Installed = at
		case m.Ready.IsZero() && isReady(e):
			m.Ready = at
		}
	}
	return m
}

// Report prints, per machine and boot, the time spent in each boot phase
// from corrald's timeline, then power-on to INVENTORIED, install done and
// hypervisor READY where the timeline shows them.
func Report(ctx context.Context, dir string, w io.Writer) error {
	ms, err := Measure(ctx, dir)
	if err != nil {
		return err
	}
	return PrintReport(w, ms)
}

// PrintReport prints ms as Report does.
func PrintReport(w io.Writer, ms []MachineFigures) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MACHINE\tFW\tBOOT\tINTENT\tPOWER→DHCP\tDHCP→SCRIPT\tSCRIPT→KERNEL+INITRD\tINITRD→AGENT\tAGENT→LAST\tTOTAL\tLAST EVENT\t")
	for _, m := range ms {
		for i, b := range m.Boots {
			start := firstNonZero(b.Power, b.DHCP)
			initrd := firstNonZero(b.Initrd, b.Kernel)
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Name, strings.ToUpper(m.Firmware), i+1, orDash(b.Intent),
				span(b.Power, b.DHCP), span(b.DHCP, b.Script), span(b.Script, initrd), span(initrd, b.Agent), span(b.Agent, b.Last),
				span(start, b.Last), short(orDash(b.LastEvent), 40))
		}
		if len(m.Boots) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t-\t(no boot in the timeline yet)\t\t\t\t\t\t\t\t\n", m.Name, strings.ToUpper(m.Firmware))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MACHINE\tPOWER→INVENTORIED\tPOWER→INSTALL DONE\tPOWER→HYPERVISOR READY\tSTATE\tNODE\t")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Name, span(m.Power, m.Inventoried), span(m.Power, m.Installed), span(m.Power, m.Ready), orDash(m.State), orDash(m.Node))
	}
	return tw.Flush()
}
