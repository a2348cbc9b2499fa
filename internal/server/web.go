package server

// WebConfig configures the rack's web page.
type WebConfig struct {
	// Listen is the HTTPS listen address of the web page ("" = off).
	Listen string
}

// initWeb adds the web page's HTTPS listener when configured.
func (s *Server) initWeb() error { return nil }
