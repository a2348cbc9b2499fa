package ipmi

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/stmcginnis/gofish"
)

// Sensor status and kind values: bounded sets, usable as metric labels.
const (
	SensorOK       = "ok"
	SensorWarning  = "warning"
	SensorCritical = "critical"
)

// SensorReading is one BMC sensor's reading.
type SensorReading struct {
	Name string
	// Kind is temperature, fan, power (watts), power-supply, current,
	// voltage or other.
	Kind  string
	Value float64
	Unit  string
	// Status is SensorOK, SensorWarning (a non-critical threshold
	// crossed) or SensorCritical (critical or non-recoverable).
	Status string
	// Threshold names the threshold crossed ("ucr", "lnc" ...; "" when ok).
	Threshold string
}

// LogEntry is one System Event Log entry.
type LogEntry struct {
	ID       uint16
	Time     time.Time
	Critical bool
	Text     string
}

// Health is what one read of a BMC's sensors and event log found.
type Health struct {
	Sensors []SensorReading
	// Dropped counts analog sensors past HealthOptions.MaxSensors.
	Dropped int
	// LogAddedAt is the BMC's "most recent addition" time of its event
	// log; Log holds its entries only when that differs from
	// HealthOptions.LogSeen.
	LogAddedAt time.Time
	Log        []LogEntry
	LogRead    bool
}

// HealthOptions bound a health read.
type HealthOptions struct {
	// MaxSensors caps the sensors returned (default 64): a BMC with
	// hundreds costs the poller and the metrics no more than this.
	MaxSensors int
	// LogSeen is the LogAddedAt of the previous read: an unchanged log
	// is not read again.
	LogSeen time.Time
	// MaxLog caps the newest log entries returned (default 64).
	MaxLog int
}

// Health reads a BMC's analog sensors (the SDR repository's full and
// compact threshold sensors, each with its reading and threshold state;
// the repository itself only when it changed, see sdrCache) and, when it
// changed, its System Event Log, over IPMI (native provider); a BMC
// answered over Redfish alone has its Thermal, Power and log services
// read instead (redfish_health.go).
func (c *Controller) Health(ctx context.Context, t Target, o HealthOptions) (Health, Answer, error) {
	o.MaxSensors = cmp.Or(o.MaxSensors, 64)
	o.MaxLog = cmp.Or(o.MaxLog, 64)
	var h Health
	a, err := c.do(ctx, t, "health", func(ctx context.Context, s *session) error {
		np, err := s.native()
		if err != nil {
			if s.redfishOpen() {
				return s.redfishCall(ctx, func(cl *gofish.APIClient) error {
					h, err = redfishHealth(cl, o)
					return err
				})
			}
			return err
		}
		start := time.Now()
		h, err = np.health(ctx, o, &c.sdrs, t.Addr())
		at := Attempt{Provider: NativeProviderName, Took: time.Since(start)}
		if err != nil {
			at.Err = err.Error()
		} else {
			s.answer.Provider = NativeProviderName
		}
		s.answer.Attempts = append(s.answer.Attempts, at)
		return err
	})
	return h, a, err
}

// sdrCache keeps each BMC's analog sensors as its SDR repository
// describes them, with the repository's most recent addition time: a poll
// asks Get SDR Repository Info (one exchange) and reads the repository
// again only when that changed, then one Get Sensor Reading a sensor.
// It is bounded: past maxCachedBMCs it starts again.
type sdrCache struct {
	mu sync.Mutex
	m  map[string]cachedSDRs
}

const maxCachedBMCs = 65536

type cachedSDRs struct {
	added   time.Time
	sensors []types.Sensor
}

func (c *sdrCache) get(addr string) (cachedSDRs, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[addr]
	return e, ok
}

func (c *sdrCache) put(addr string, e cachedSDRs) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedBMCs {
		c.m = map[string]cachedSDRs{}
	}
	c.m[addr] = e
}

// analogSensors are the threshold sensors with an analog reading the
// SDR repository lists (full and compact records).
func analogSensors(sdrs []*types.SDR) []types.Sensor {
	var out []types.Sensor
	for _, sdr := range sdrs {
		if sdr == nil || !sdr.HasAnalogReading() {
			continue
		}
		s := types.Sensor{SDRRecordType: sdr.RecordHeader.RecordType, HasAnalogReading: true}
		switch {
		case sdr.Full != nil:
			f := sdr.Full
			s.Number, s.Name, s.SensorUnit, s.SensorType = uint8(f.SensorNumber), strings.TrimSpace(string(f.IDStringBytes)), f.SensorUnit, f.SensorType
			s.EventReadingType = f.SensorEventReadingType
			s.Threshold.LinearizationFunc, s.Threshold.ReadingFactors = f.LinearizationFunc, f.ReadingFactors
		case sdr.Compact != nil:
			c := sdr.Compact
			s.Number, s.Name, s.SensorUnit, s.SensorType = uint8(c.SensorNumber), strings.TrimSpace(string(c.IDStringBytes)), c.SensorUnit, c.SensorType
			s.EventReadingType = c.SensorEventReadingType
		default:
			continue
		}
		out = append(out, s)
	}
	return out
}

func (p *nativeProvider) health(ctx context.Context, o HealthOptions, cache *sdrCache, addr string) (Health, error) {
	var h Health
	repo, err := p.c.GetSDRRepoInfo(ctx)
	if err != nil {
		return h, classifyNative(ctx, err)
	}
	e, ok := cache.get(addr)
	if !ok || !e.added.Equal(repo.MostRecentAdditionTime) {
		sdrs, err := p.c.GetSDRs(ctx, types.SDRRecordTypeFullSensor, types.SDRRecordTypeCompactSensor)
		if err != nil {
			return h, classifyNative(ctx, err)
		}
		e = cachedSDRs{added: repo.MostRecentAdditionTime, sensors: analogSensors(sdrs)}
		cache.put(addr, e)
	}
	for i := range e.sensors {
		s := e.sensors[i] // a copy: the cache's stays as read
		if len(h.Sensors) == o.MaxSensors {
			h.Dropped++
			continue
		}
		rd, err := p.c.GetSensorReading(ctx, s.Number)
		if err != nil {
			if _, ok := types.IsResponseError(err); ok {
				continue // not present, or no reading now
			}
			return h, classifyNative(ctx, err)
		}
		if rd.ReadingUnavailable || rd.SensorScanningDisabled {
			continue
		}
		st := string(rd.ThresholdStatus())
		r := SensorReading{Name: s.Name, Kind: sensorKind(&s), Value: s.ConvertReading(rd.Reading), Unit: s.SensorUnit.BaseUnit.String(), Status: SensorOK}
		switch types.SensorThresholdStatus(st) {
		case types.SensorThresholdStatus_UNC, types.SensorThresholdStatus_LNC:
			r.Status, r.Threshold = SensorWarning, st
		case types.SensorThresholdStatus_UCR, types.SensorThresholdStatus_LCR, types.SensorThresholdStatus_UNR, types.SensorThresholdStatus_LNR:
			r.Status, r.Threshold = SensorCritical, st
		}
		h.Sensors = append(h.Sensors, r)
	}
	info, err := p.c.GetSELInfo(ctx)
	if err != nil {
		// A BMC without an event log still has sensors.
		return h, nil //nolint:nilerr // the log is optional
	}
	h.LogAddedAt = info.RecentAdditionTime
	if info.Entries == 0 {
		// An empty log is a log read: one cleared since the last poll
		// holds no critical entry any more (its last addition time may
		// not have changed).
		h.LogRead = true
		return h, nil
	}
	if h.LogAddedAt.Equal(o.LogSeen) {
		return h, nil
	}
	entries, err := p.c.GetSELEntries(ctx, 0)
	if err != nil {
		return h, classifyNative(ctx, err)
	}
	h.LogRead = true
	if len(entries) > o.MaxLog {
		entries = entries[len(entries)-o.MaxLog:]
	}
	for _, e := range entries {
		h.Log = append(h.Log, logEntry(e))
	}
	return h, nil
}

// sensorKind maps a sensor to a bounded set of kinds.
func sensorKind(s *types.Sensor) string {
	switch {
	case s.SensorUnit.BaseUnit == types.SensorUnitType_Watts:
		return "power"
	case s.SensorType == types.SensorTypeTemperature:
		return "temperature"
	case s.SensorType == types.SensorTypeFan:
		return "fan"
	case s.SensorType == types.SensorTypePowerSupply:
		return "power-supply"
	case s.SensorType == types.SensorTypeCurrent:
		return "current"
	case s.SensorType == types.SensorTypeVoltage:
		return "voltage"
	}
	return "other"
}

// criticalSpecific lists sensor-specific event offsets that mean a part
// failed (IPMI 2.0 table 42-3): processor IERR and thermal trip, power
// supply failure and AC lost, uncorrectable memory ECC and parity,
// critical interrupts (bus fatal, NMI, PCI SERR).
var criticalSpecific = map[types.SensorType][]uint8{
	types.SensorTypeProcessor:         {0x00, 0x01},
	types.SensorTypePowerSupply:       {0x01, 0x03},
	types.SensorTypeMemory:            {0x01, 0x02},
	types.SensorTypeCriticalInterrupt: {0x00, 0x04, 0x05, 0x07, 0x08, 0x0a},
}

// logEntry turns a SEL record into a LogEntry: an asserted critical or
// non-recoverable threshold event, or one of criticalSpecific, is
// critical.
func logEntry(e *types.SEL) LogEntry {
	le := LogEntry{ID: e.RecordID}
	st := e.Standard
	if st == nil {
		le.Text = fmt.Sprintf("OEM record type 0x%02x", uint8(e.RecordType))
		return le
	}
	le.Time = st.Timestamp
	offset := st.EventData.EventData1 & 0x0f
	dir := "asserted"
	if st.EventDir != types.EventDirAssertion {
		dir = "deasserted"
	}
	le.Text = fmt.Sprintf("sensor %d (%s) event 0x%02x offset %d %s", uint8(st.SensorNumber), st.SensorType.String(), uint8(st.EventReadingType), offset, dir)
	if st.EventDir != types.EventDirAssertion {
		return le
	}
	switch st.EventReadingType {
	case types.EventReadingTypeThreshold:
		// 2/3 lower critical, 4/5 lower non-recoverable, 8/9 upper
		// critical, 0xa/0xb upper non-recoverable.
		le.Critical = slices.Contains([]uint8{2, 3, 4, 5, 8, 9, 0x0a, 0x0b}, offset)
	case types.EventReadingTypeSensorSpecific:
		le.Critical = slices.Contains(criticalSpecific[st.SensorType], offset)
	default:
		// Generic discrete events (state, severity, presence ...) are
		// not read as failures.
	}
	return le
}
