package redfishtest

import (
	"net/http"
	"strconv"
	"strings"
)

const (
	chassisURI  = "/redfish/v1/Chassis"
	chassis1    = "/redfish/v1/Chassis/1"
	thermalURI  = "/redfish/v1/Chassis/1/Thermal"
	powerURI    = "/redfish/v1/Chassis/1/Power"
	managersURI = "/redfish/v1/Managers"
	manager1    = "/redfish/v1/Managers/1"
	logSvcsURI  = "/redfish/v1/Managers/1/LogServices"
	selURI      = "/redfish/v1/Managers/1/LogServices/SEL"
	selEntries  = "/redfish/v1/Managers/1/LogServices/SEL/Entries"
)

// Temperature is one Thermal Temperatures member (thresholds 0: none).
type Temperature struct {
	Name                                      string
	ReadingCelsius                            float64
	UpperThresholdNonCritical, UpperThreshold float64 // UpperThreshold is UpperThresholdCritical
	Health                                    string  // Status.Health: OK, Warning, Critical ("" is OK)
}

// Fan is one Thermal Fans member, read in RPM (thresholds 0: none).
type Fan struct {
	Name                   string
	Reading                int
	LowerThresholdCritical int
	UpperThresholdCritical int
	Health                 string
}

// PowerSupply is one Power PowerSupplies member.
type PowerSupply struct {
	Name             string
	PowerOutputWatts float64
	Health           string
}

// LogEntry is one SEL entry; Severity is OK, Warning or Critical.
type LogEntry struct {
	ID       int
	Created  string // RFC 3339
	Severity string
	Message  string
}

// Health is what the service's chassis and event log report.
type Health struct {
	Temperatures       []Temperature
	Fans               []Fan
	PowerSupplies      []PowerSupply
	PowerConsumedWatts float64
	SEL                []LogEntry
	// SELLinksOnly answers the SEL's collection with links, not the
	// entries themselves.
	SELLinksOnly bool
}

// DefaultHealth is a healthy machine: two temperatures, two fans, one
// power supply, 180 W drawn, an empty log.
func DefaultHealth() Health {
	return Health{
		Temperatures: []Temperature{
			{Name: "CPU1 Temp", ReadingCelsius: 45, UpperThresholdNonCritical: 85, UpperThreshold: 95},
			{Name: "Inlet Temp", ReadingCelsius: 22, UpperThresholdNonCritical: 40, UpperThreshold: 45},
		},
		Fans: []Fan{
			{Name: "Fan1", Reading: 6000, LowerThresholdCritical: 1000, UpperThresholdCritical: 18000},
			{Name: "Fan2", Reading: 6100, LowerThresholdCritical: 1000, UpperThresholdCritical: 18000},
		},
		PowerSupplies:      []PowerSupply{{Name: "PSU1", PowerOutputWatts: 190}},
		PowerConsumedWatts: 180,
	}
}

// SetHealth replaces what Thermal, Power and the SEL report.
func (s *Server) SetHealth(h Health) {
	s.mu.Lock()
	s.health = h
	s.mu.Unlock()
}

func status(health string) map[string]string {
	if health == "" {
		health = "OK"
	}
	return map[string]string{"State": "Enabled", "Health": health}
}

func collection(uri, typ string, members ...string) map[string]any {
	m := make([]map[string]string, 0, len(members))
	for _, u := range members {
		m = append(m, map[string]string{"@odata.id": u})
	}
	return map[string]any{"@odata.id": uri, "@odata.type": typ, "Name": typ, "Members": m, "Members@odata.count": len(m)}
}

func logEntryJSON(e LogEntry) map[string]any {
	id := strconv.Itoa(e.ID)
	return map[string]any{"@odata.id": selEntries + "/" + id, "@odata.type": "#LogEntry.v1_4_0.LogEntry",
		"Id": id, "Name": "Log Entry " + id, "EntryType": "SEL", "Created": e.Created, "Severity": e.Severity, "Message": e.Message}
}

// serveHealth answers Chassis, Managers and the SEL; false for other
// paths.
func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request, path string) bool {
	if r.Method != http.MethodGet {
		return false
	}
	s.mu.Lock()
	h := s.health
	s.mu.Unlock()
	if strings.HasPrefix(path, selEntries+"/") {
		for _, e := range h.SEL {
			if path == selEntries+"/"+strconv.Itoa(e.ID) {
				writeJSON(w, 200, logEntryJSON(e))
				return true
			}
		}
		return false
	}
	switch path {
	case chassisURI:
		writeJSON(w, 200, collection(chassisURI, "#ChassisCollection.ChassisCollection", chassis1))
	case chassis1:
		writeJSON(w, 200, map[string]any{"@odata.id": chassis1, "@odata.type": "#Chassis.v1_10_0.Chassis", "Id": "1", "Name": "Chassis",
			"ChassisType": "RackMount", "Status": status(""),
			"Thermal": map[string]string{"@odata.id": thermalURI}, "Power": map[string]string{"@odata.id": powerURI}})
	case thermalURI:
		temps := []map[string]any{}
		for i, t := range h.Temperatures {
			temps = append(temps, map[string]any{"@odata.id": thermalURI + "#/Temperatures/" + strconv.Itoa(i), "MemberId": strconv.Itoa(i),
				"Name": t.Name, "ReadingCelsius": t.ReadingCelsius, "UpperThresholdNonCritical": t.UpperThresholdNonCritical,
				"UpperThresholdCritical": t.UpperThreshold, "Status": status(t.Health)})
		}
		fans := []map[string]any{}
		for i, f := range h.Fans {
			fans = append(fans, map[string]any{"@odata.id": thermalURI + "#/Fans/" + strconv.Itoa(i), "MemberId": strconv.Itoa(i),
				"Name": f.Name, "Reading": f.Reading, "ReadingUnits": "RPM", "LowerThresholdCritical": f.LowerThresholdCritical,
				"UpperThresholdCritical": f.UpperThresholdCritical, "Status": status(f.Health)})
		}
		writeJSON(w, 200, map[string]any{"@odata.id": thermalURI, "@odata.type": "#Thermal.v1_5_0.Thermal", "Id": "Thermal", "Name": "Thermal",
			"Temperatures": temps, "Fans": fans})
	case powerURI:
		psus := []map[string]any{}
		for i, p := range h.PowerSupplies {
			psus = append(psus, map[string]any{"@odata.id": powerURI + "#/PowerSupplies/" + strconv.Itoa(i), "MemberId": strconv.Itoa(i),
				"Name": p.Name, "PowerOutputWatts": p.PowerOutputWatts, "Status": status(p.Health)})
		}
		writeJSON(w, 200, map[string]any{"@odata.id": powerURI, "@odata.type": "#Power.v1_5_0.Power", "Id": "Power", "Name": "Power",
			"PowerControl": []map[string]any{{"@odata.id": powerURI + "#/PowerControl/0", "MemberId": "0", "Name": "System Power Control",
				"PowerConsumedWatts": h.PowerConsumedWatts, "Status": status("")}},
			"PowerSupplies": psus})
	case managersURI:
		writeJSON(w, 200, collection(managersURI, "#ManagerCollection.ManagerCollection", manager1))
	case manager1:
		writeJSON(w, 200, map[string]any{"@odata.id": manager1, "@odata.type": "#Manager.v1_5_0.Manager", "Id": "1", "Name": "Manager",
			"ManagerType": "BMC", "Status": status(""), "LogServices": map[string]string{"@odata.id": logSvcsURI},
			"VirtualMedia":  map[string]string{"@odata.id": virtualMediaURI},
			"SerialConsole": s.Console.managerSerialConsoleJSON(), "NetworkProtocol": map[string]string{"@odata.id": networkProtocolURI}})
	case networkProtocolURI:
		writeJSON(w, 200, s.Console.networkProtocolJSON())
	case logSvcsURI:
		writeJSON(w, 200, collection(logSvcsURI, "#LogServiceCollection.LogServiceCollection", selURI))
	case selURI:
		writeJSON(w, 200, map[string]any{"@odata.id": selURI, "@odata.type": "#LogService.v1_1_0.LogService", "Id": "SEL", "Name": "System Event Log",
			"LogEntryType": "SEL", "Entries": map[string]string{"@odata.id": selEntries}})
	case selEntries:
		// Members expanded, as many BMCs answer (or links only, honouring
		// $skip, when Health.SELLinksOnly); clients may also GET each one.
		members := []map[string]any{}
		sel := h.SEL
		if h.SELLinksOnly {
			if n, err := strconv.Atoi(r.URL.Query().Get("$skip")); err == nil && n > 0 {
				sel = sel[min(n, len(sel)):]
			}
		}
		for _, e := range sel {
			if h.SELLinksOnly {
				members = append(members, map[string]any{"@odata.id": selEntries + "/" + strconv.Itoa(e.ID)})
				continue
			}
			members = append(members, logEntryJSON(e))
		}
		writeJSON(w, 200, map[string]any{"@odata.id": selEntries, "@odata.type": "#LogEntryCollection.LogEntryCollection", "Name": "Log Entries",
			"Members": members, "Members@odata.count": len(h.SEL)})
	default:
		return false
	}
	return true
}
