package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Down stops every process the state file names (each checked against
// /proc/PID/cmdline first; in a fleet the appliances, then the etcd
// members), deletes the taps, the appliances' links, the bridge, the veth
// pair and the namespace, and removes the state file and the client files. Binaries, the run's
// files and the image cache stay. Errors are collected: Down does as much
// as it can.
func Down(ctx context.Context, dir string, out io.Writer) error {
	s, err := LoadState(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range s.Machines {
		if pid := readPid(m.QEMUPidFile()); pid > 0 {
			if err := stop(Process{PID: pid, Marker: m.Dir}, 5*time.Second); err != nil {
				errs = append(errs, fmt.Errorf("%s QEMU: %w", m.Name, err))
			} else {
				fmt.Fprintf(out, "%s: QEMU stopped (pid %d)\n", m.Name, pid)
			}
			_ = os.Remove(m.QEMUPidFile())
		}
		if m.Sim.PID > 0 {
			if err := stop(m.Sim, 3*time.Second); err != nil {
				errs = append(errs, fmt.Errorf("%s ipmi_sim: %w", m.Name, err))
			} else {
				fmt.Fprintf(out, "%s: ipmi_sim stopped (pid %d)\n", m.Name, m.Sim.PID)
			}
		}
	}
	// A QEMU the BMC started after the pid file was read, or one that
	// raced the stop: look once more.
	for _, m := range s.Machines {
		if pid := readPid(m.QEMUPidFile()); pid > 0 {
			_ = stop(Process{PID: pid, Marker: m.Dir}, 5*time.Second)
		}
	}
	if s.Fleet() {
		errs = append(errs, s.stopFleet(out)...)
	} else if s.Corrald.PID > 0 {
		if err := stop(s.Corrald, 15*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("corrald: %w", err))
		} else {
			fmt.Fprintf(out, "corrald stopped (pid %d)\n", s.Corrald.PID)
		}
	}
	if nsExists(ctx, s.Namespace) {
		for _, m := range s.Machines {
			_ = s.ipn(ctx, "link", "del", m.Tap)
		}
		for _, a := range s.Appliances {
			_ = s.ipn(ctx, "link", "del", a.Port)
		}
		_ = s.ipn(ctx, "link", "del", s.Bridge)
	}
	if linkExists(ctx, s.VethHost) {
		if err := ip(ctx, "link", "del", s.VethHost); err != nil {
			errs = append(errs, err)
		}
	}
	if nsExists(ctx, s.Namespace) {
		if err := ip(ctx, "netns", "del", s.Namespace); err != nil {
			errs = append(errs, err)
		}
	}
	fmt.Fprintf(out, "namespace %s, bridge %s, veth %s and %d taps deleted\n", s.Namespace, s.Bridge, s.VethHost, len(s.Machines))
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	_ = os.Remove(s.ClientConfig)
	for _, a := range s.Appliances {
		_ = os.Remove(a.ClientConfig)
	}
	return os.Remove(filepath.Join(dir, StateFile))
}
