package server

// initBackup registers the admin backup service.
func (s *Server) initBackup() error { return nil }
