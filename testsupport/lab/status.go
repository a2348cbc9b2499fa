package lab

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// reached reports whether v is at or past target for lm.
func reached(target Target, lm Machine, v view) bool {
	switch target {
	case UntilNone:
		return true
	case UntilInventoried:
		if v.Machine == nil || v.Machine.GetSerial() != lm.Serial {
			return false
		}
		switch v.Machine.GetState() {
		case inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_INSTALLING, inventoryv1.Machine_DEPLOYED:
			return true
		default: // not yet there, failed or held: not reached
			return false
		}
	case UntilDeployed:
		return v.Machine.GetState() == inventoryv1.Machine_DEPLOYED
	case UntilReady:
		return v.NodeState() == "READY"
	}
	return false
}

// watch prints every machine's state changes until all reach target, one
// fails, or wait passes.
func (s *State) watch(ctx context.Context, a *api, target Target, wait time.Duration, say func(string, ...any)) error {
	if target == UntilNone {
		return nil
	}
	say("waiting up to %s for every machine to be %s", wait, strings.ToUpper(string(target)))
	type seen struct{ state, node, serial string }
	last := map[string]seen{}
	lastEvent := map[string]string{}
	deadline := time.Now().Add(wait)
	for {
		snap, err := a.snapshot(ctx, s)
		if err != nil {
			say("corrald: %v", err)
		}
		done, failed := 0, []string{}
		for _, lm := range s.Machines {
			v := snap[lm.Name]
			cur := seen{state: v.State(), node: v.NodeState()}
			if v.Machine != nil {
				cur.serial = v.Machine.GetSerial()
			}
			if cur != last[lm.Name] {
				msg := fmt.Sprintf("%s: %s", lm.Name, orDash(cur.state))
				if cur.serial != "" {
					msg += " serial " + cur.serial
				}
				if cur.node != "" {
					msg += fmt.Sprintf(", node %s %s", v.Node.GetName(), cur.node)
				}
				if r := v.Machine.GetStateReason(); r != "" {
					msg += " (" + r + ")"
				}
				say("%s", msg)
				last[lm.Name] = cur
			}
			// The newest boot step, so a slow boot shows where it is.
			if es, err := a.timeline(ctx, lm, v, 5); err == nil && len(es) > 0 {
				e := es[len(es)-1]
				key := e.GetSource() + " " + e.GetEvent()
				if key != lastEvent[lm.Name] {
					lastEvent[lm.Name] = key
					say("%s:   %s %s: %s", lm.Name, e.GetSource(), e.GetEvent(), short(e.GetDetail(), 90))
				}
			}
			if reached(target, lm, v) {
				done++
			}
			if v.Machine.GetState() == inventoryv1.Machine_FAILED {
				failed = append(failed, fmt.Sprintf("%s FAILED: %s", lm.Name, v.Machine.GetStateReason()))
			}
		}
		if done == len(s.Machines) {
			say("all %d machines %s", done, strings.ToUpper(string(target)))
			return nil
		}
		if len(failed) > 0 && done+len(failed) == len(s.Machines) {
			return fmt.Errorf("%s", strings.Join(failed, "; "))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d machines %s after %s; the lab keeps running: corral-lab status", done, len(s.Machines), strings.ToUpper(string(target)), wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func short(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

// MachineStatus is one row of Status.
type MachineStatus struct {
	Name     string
	Firmware string
	Serial   string
	MAC      string
	Record   string // corrald's machine name
	State    string
	Reason   string
	Power    string
	QEMU     bool // a QEMU process for the machine runs
	Node     string
	NodeSt   string
	Timeline []*inventoryv1.TimelineEntry
}

// Status reads the lab's machines from corrald and the host.
func Status(ctx context.Context, dir string, events int) (*State, []MachineStatus, error) {
	s, err := LoadState(dir)
	if err != nil {
		return nil, nil, err
	}
	a, err := dialAPI(s)
	if err != nil {
		return s, nil, err
	}
	defer a.Close()
	snap, err := a.snapshot(ctx, s)
	if err != nil {
		return s, nil, err
	}
	var out []MachineStatus
	for _, lm := range s.Machines {
		v := snap[lm.Name]
		ms := MachineStatus{Name: lm.Name, Firmware: lm.Firmware, Serial: lm.Serial, MAC: lm.MAC, State: v.State(),
			QEMU: alive(readPid(lm.QEMUPidFile()), lm.Dir), NodeSt: v.NodeState()}
		if v.Machine != nil {
			ms.Record, ms.Reason = v.Machine.GetName(), v.Machine.GetStateReason()
			ms.Power = strings.TrimPrefix(v.Machine.GetPowerState().String(), "POWER_STATE_")
		}
		if v.Node != nil {
			ms.Node = v.Node.GetName()
		}
		if events > 0 {
			ms.Timeline, _ = a.timeline(ctx, lm, v, uint32(events))
		}
		out = append(out, ms)
	}
	return s, out, nil
}

// PrintStatus writes Status as a table, each machine followed by its
// newest timeline entries.
func PrintStatus(w io.Writer, s *State, rows []MachineStatus) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	if s.Fleet() {
		fmt.Fprintf(tw, "lab %s (namespace %s, %d appliances)\n", s.ID, s.Namespace, len(s.Appliances))
	} else {
		fmt.Fprintf(tw, "lab %s (namespace %s, corrald pid %d %s)\n", s.ID, s.Namespace, s.Corrald.PID, aliveWord(alive(s.Corrald.PID, s.Corrald.Marker)))
	}
	fmt.Fprintln(tw, "MACHINE\tFIRMWARE\tSERIAL\tMAC\tSTATE\tPOWER\tQEMU\tNODE")
	for _, r := range rows {
		node := "-"
		if r.Node != "" {
			node = r.Node + " " + r.NodeSt
		}
		state := orDash(r.State)
		if r.Reason != "" {
			state += " (" + short(r.Reason, 60) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, strings.ToUpper(r.Firmware), r.Serial, r.MAC, state, orDash(r.Power), aliveWord(r.QEMU), node)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if len(r.Timeline) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (%s), last %d timeline entries:\n", r.Name, orDash(r.Record), len(r.Timeline))
		es := append([]*inventoryv1.TimelineEntry(nil), r.Timeline...)
		sort.SliceStable(es, func(i, j int) bool { return es[i].GetAt().AsTime().Before(es[j].GetAt().AsTime()) })
		for _, e := range es {
			fmt.Fprintf(w, "  %s  %-9s %-22s %s\n", e.GetAt().AsTime().Local().Format("15:04:05.000"), e.GetSource(), short(e.GetEvent(), 22), short(e.GetDetail(), 100))
		}
	}
	return nil
}

func aliveWord(b bool) string {
	if b {
		return "running"
	}
	return "stopped"
}
