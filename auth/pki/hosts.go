package pki

import (
	"net"
	"os"
	"strings"
)

// LocalHosts returns the names and addresses by which this machine may be
// reached, for use as server certificate SANs: os.Hostname(), "localhost",
// every address of every local interface (net.InterfaceAddrs), 127.0.0.1
// and ::1, deduplicated in that order. Addresses are in canonical textual
// form. It never fails: a hostname or interface lookup error just leaves
// those entries out.
func LocalHosts() []string {
	var out []string
	seen := map[string]bool{}
	add := func(h string) {
		if h == "" {
			return
		}
		key := strings.ToLower(h)
		if ip := net.ParseIP(h); ip != nil {
			h = ip.String()
			key = h
		}
		if !seen[key] {
			seen[key] = true
			out = append(out, h)
		}
	}
	if name, err := os.Hostname(); err == nil {
		add(name)
	}
	add("localhost")
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			switch v := a.(type) {
			case *net.IPNet:
				add(v.IP.String())
			case *net.IPAddr:
				add(v.IP.String())
			}
		}
	}
	add("127.0.0.1")
	add("::1")
	return out
}
