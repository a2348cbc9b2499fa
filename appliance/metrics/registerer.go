package metrics

import "github.com/prometheus/client_golang/prometheus"

// Registerer is the appliance's registry, for features that export
// collectors of their own (appliance/webhook).
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }
