package ipmi

import (
	"cmp"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"
	"github.com/stmcginnis/gofish/redfish"
)

// A Redfish BMC's health is its chassis' Thermal (Temperatures, Fans) and
// Power (PowerControl's PowerConsumedWatts, PowerSupplies) and its
// managers' log services' entries. A reading past a threshold the BMC
// publishes, or a member whose Status.Health is Warning or Critical,
// gives the same statuses as IPMI's threshold states; a log entry of
// Severity Critical is a critical entry. Redfish has no "most recent
// addition" time, so the log is read every time and LogAddedAt is its
// newest entry's Created.

// redfishThreshold is the status and threshold name a reading has
// against its published thresholds (0: not published).
func redfishThreshold(v, lnc, lcr, lnr, unc, ucr, unr float64) (string, string) {
	switch {
	case unr != 0 && v >= unr:
		return SensorCritical, "unr"
	case ucr != 0 && v >= ucr:
		return SensorCritical, "ucr"
	case lnr != 0 && v <= lnr:
		return SensorCritical, "lnr"
	case lcr != 0 && v <= lcr:
		return SensorCritical, "lcr"
	case unc != 0 && v >= unc:
		return SensorWarning, "unc"
	case lnc != 0 && v <= lnc:
		return SensorWarning, "lnc"
	}
	return SensorOK, ""
}

// withHealth raises a reading's status to what the member's
// Status.Health says, when that is worse.
func withHealth(r SensorReading, st common.Status) SensorReading {
	switch {
	case st.Health == common.CriticalHealth && r.Status != SensorCritical:
		r.Status, r.Threshold = SensorCritical, "health"
	case st.Health == common.WarningHealth && r.Status == SensorOK:
		r.Status, r.Threshold = SensorWarning, "health"
	}
	return r
}

func present(st common.Status) bool {
	return st.State != common.AbsentState && st.State != common.DisabledState
}

func redfishHealth(cl *gofish.APIClient, o HealthOptions) (Health, error) {
	var h Health
	add := func(r SensorReading) {
		if len(h.Sensors) == o.MaxSensors {
			h.Dropped++
			return
		}
		h.Sensors = append(h.Sensors, r)
	}
	chassis, err := cl.Service.Chassis()
	if err != nil {
		return h, err
	}
	for _, ch := range chassis {
		th, err := ch.Thermal()
		if err != nil {
			return h, err
		}
		if th != nil {
			for _, t := range th.Temperatures {
				if !present(t.Status) {
					continue
				}
				v := float64(t.ReadingCelsius)
				st, thr := redfishThreshold(v, float64(t.LowerThresholdNonCritical), float64(t.LowerThresholdCritical), float64(t.LowerThresholdFatal),
					float64(t.UpperThresholdNonCritical), float64(t.UpperThresholdCritical), float64(t.UpperThresholdFatal))
				add(withHealth(SensorReading{Name: t.Name, Kind: "temperature", Value: v, Unit: "degrees C", Status: st, Threshold: thr}, t.Status))
			}
			for _, f := range th.Fans {
				if !present(f.Status) {
					continue
				}
				v := float64(f.Reading)
				st, thr := redfishThreshold(v, float64(f.LowerThresholdNonCritical), float64(f.LowerThresholdCritical), float64(f.LowerThresholdFatal),
					float64(f.UpperThresholdNonCritical), float64(f.UpperThresholdCritical), float64(f.UpperThresholdFatal))
				unit := "RPM"
				if f.ReadingUnits == redfish.PercentReadingUnits {
					unit = "percent"
				}
				add(withHealth(SensorReading{Name: cmp.Or(f.Name, f.MemberID), Kind: "fan", Value: v, Unit: unit, Status: st, Threshold: thr}, f.Status))
			}
		}
		pw, err := ch.Power()
		if err != nil {
			return h, err
		}
		if pw != nil {
			for _, pc := range pw.PowerControl {
				add(withHealth(SensorReading{Name: cmp.Or(pc.Name, "Power "+pc.MemberID), Kind: "power", Value: float64(pc.PowerConsumedWatts),
					Unit: "Watts", Status: SensorOK}, pc.Status))
			}
			for _, ps := range pw.PowerSupplies {
				if !present(ps.Status) {
					continue
				}
				add(withHealth(SensorReading{Name: cmp.Or(ps.Name, "PSU "+ps.MemberID), Kind: "power-supply",
					Value: float64(ps.PowerOutputWatts), Unit: "Watts", Status: SensorOK}, ps.Status))
			}
		}
	}
	managers, err := cl.Service.Managers()
	if err != nil {
		return h, err
	}
	var log []LogEntry
	for _, m := range managers {
		services, err := m.LogServices()
		if err != nil {
			return h, err
		}
		for _, ls := range services {
			entries, err := redfishLogEntries(cl, ls, o.MaxLog)
			if err != nil {
				return h, err
			}
			for i, e := range entries {
				log = append(log, redfishLogEntry(e, i))
			}
		}
	}
	slices.SortStableFunc(log, func(a, b LogEntry) int { return a.Time.Compare(b.Time) })
	if len(log) > o.MaxLog {
		log = log[len(log)-o.MaxLog:]
	}
	h.Log, h.LogRead = log, true
	if len(log) > 0 {
		h.LogAddedAt = log[len(log)-1].Time
	}
	return h, nil
}

// redfishLogEntry turns a LogEntry into ours: its Id when numeric (else
// its place in the log, from 1), Created, Severity Critical.
func redfishLogEntry(e *redfish.LogEntry, i int) LogEntry {
	le := LogEntry{Critical: e.Severity == redfish.CriticalEventSeverity, Text: cmp.Or(e.Message, e.Name)}
	if id, err := strconv.ParseUint(e.ID, 10, 16); err == nil {
		le.ID = uint16(id)
	} else {
		le.ID = uint16(i + 1)
	}
	if t, err := time.Parse(time.RFC3339, e.Created); err == nil {
		le.Time = t
	}
	return le
}

// redfishLogEntries reads the newest entries (at most newest) of a log service.
// gofish's Entries GETs every member, one request each, however long the
// log: the collection is read first, and its members are used as they
// are when the BMC expanded them; otherwise only the last ones are asked
// for ($skip).
func redfishLogEntries(cl *gofish.APIClient, ls *redfish.LogService, newest int) ([]*redfish.LogEntry, error) {
	var svc struct {
		Entries struct {
			ID string `json:"@odata.id"`
		}
	}
	if err := getJSON(cl, ls.ODataID, &svc); err != nil || svc.Entries.ID == "" {
		return ls.Entries()
	}
	var coll struct {
		Count   int               `json:"Members@odata.count"`
		Next    string            `json:"Members@odata.nextLink"`
		Members []json.RawMessage `json:"Members"`
	}
	if err := getJSON(cl, svc.Entries.ID, &coll); err != nil {
		return nil, err
	}
	if coll.Next == "" && len(coll.Members) == coll.Count {
		var out []*redfish.LogEntry
		for _, raw := range coll.Members {
			var probe map[string]json.RawMessage
			if err := json.Unmarshal(raw, &probe); err != nil || probe["Id"] == nil {
				out = nil // links only: not expanded
				break
			}
			var e redfish.LogEntry
			if err := json.Unmarshal(raw, &e); err != nil {
				return nil, err
			}
			out = append(out, &e)
		}
		if out != nil || coll.Count == 0 {
			return out, nil
		}
	}
	if coll.Count <= newest {
		return ls.Entries()
	}
	return ls.FilteredEntries(common.WithSkip(coll.Count - newest))
}

func getJSON(cl *gofish.APIClient, uri string, v any) error {
	resp, err := cl.Get(uri)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(v)
}
