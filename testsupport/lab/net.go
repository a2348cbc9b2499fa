package lab

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
)

// ip runs the ip command and returns its error with its output.
func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// ipn runs ip inside the lab's namespace.
func (s *State) ipn(ctx context.Context, args ...string) error {
	return ip(ctx, append([]string{"-n", s.Namespace}, args...)...)
}

// createNetwork makes the namespace, its bridge and the veth pair that
// gives the host the API. Each step is recorded in s first.
func (s *State) createNetwork(ctx context.Context) error {
	if err := ip(ctx, "netns", "add", s.Namespace); err != nil {
		return err
	}
	steps := [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", s.Bridge, "type", "bridge"},
		{"addr", "add", s.Subnet + ".1/24", "dev", s.Bridge},
		{"link", "set", s.Bridge, "up"},
	}
	for _, st := range steps {
		if err := s.ipn(ctx, st...); err != nil {
			return err
		}
	}
	if err := ip(ctx, "link", "add", s.VethHost, "type", "veth", "peer", "name", s.VethNS, "netns", s.Namespace); err != nil {
		return err
	}
	if err := ip(ctx, "addr", "add", s.HostAddr+"/30", "dev", s.VethHost); err != nil {
		return err
	}
	if err := ip(ctx, "link", "set", s.VethHost, "up"); err != nil {
		return err
	}
	if err := s.ipn(ctx, "addr", "add", s.NSAddr+"/30", "dev", s.VethNS); err != nil {
		return err
	}
	return s.ipn(ctx, "link", "set", s.VethNS, "up")
}

// addTap adds a machine's tap to the bridge.
func (s *State) addTap(ctx context.Context, tap string) error {
	for _, st := range [][]string{
		{"tuntap", "add", tap, "mode", "tap"},
		{"link", "set", tap, "master", s.Bridge},
		{"link", "set", tap, "up"},
	} {
		if err := s.ipn(ctx, st...); err != nil {
			return err
		}
	}
	return nil
}

// hostPrefixes lists the IPv4 prefixes routed on the host.
func hostPrefixes(ctx context.Context) ([]netip.Prefix, error) {
	out, err := exec.CommandContext(ctx, "ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return nil, fmt.Errorf("ip route: %w", err)
	}
	var ps []netip.Prefix
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if dst == "local" || dst == "broadcast" || dst == "unreachable" || dst == "blackhole" {
			if len(f) < 2 {
				continue
			}
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if p, err := netip.ParsePrefix(dst); err == nil {
			ps = append(ps, p.Masked())
		}
	}
	return ps, nil
}

// freePrefix returns the first candidate that overlaps none of used.
func freePrefix(cands []netip.Prefix, used []netip.Prefix) (netip.Prefix, bool) {
	for _, c := range cands {
		ok := true
		for _, u := range used {
			if c.Overlaps(u) {
				ok = false
				break
			}
		}
		if ok {
			return c, true
		}
	}
	return netip.Prefix{}, false
}

// linkExists reports whether a host link of that name exists.
func linkExists(ctx context.Context, name string) bool {
	return exec.CommandContext(ctx, "ip", "link", "show", "dev", name).Run() == nil
}

// nsExists reports whether a named network namespace exists.
func nsExists(ctx context.Context, name string) bool {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return true
		}
	}
	return false
}
