package server

// BMCConfig configures BMC control: sealed credentials and the power
// poller (DESIGN.md §1 step 1, §6).
type BMCConfig struct{}

// initBMC wires BMC control into s (s.addComponent) after the store and
// inventory exist.
func (s *Server) initBMC() error { return nil }
