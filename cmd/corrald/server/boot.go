package server

// BootConfig configures network boot: DHCP, TFTP, HTTP and RA (DESIGN.md
// §1 steps 2-4, §5).
type BootConfig struct{}

// initBoot wires the boot servers into s (s.addComponent) after the store,
// CA and inventory exist.
func (s *Server) initBoot() error { return nil }
