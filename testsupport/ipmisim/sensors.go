package ipmisim

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/ipmisim/simconf"
	"github.com/corralhq/corral/testsupport/require"
)

// consoles holds the console port of each BMC StartWithSensors started
// (kept here so that BMC, in ipmisim.go, stays as it is).
var consoles sync.Map // *BMC -> int

// Sensor is one analog threshold sensor of a simulated BMC: a full sensor
// record in its SDR repository (value = M × raw, in Unit) and the sensor
// behind it, with its upper critical and non-critical thresholds (raw).
type Sensor struct {
	Number uint8
	Name   string // at most 16 bytes
	// Type is the IPMI sensor type (0x01 temperature, 0x04 fan, 0x08
	// power supply, 0x03 current ...); Unit the IPMI base unit code (1
	// degrees C, 18 RPM, 6 watts).
	Type, Unit uint8
	M          uint8 // reading factor (1 when 0)
	Raw        uint8 // the reading at start
	// UNC and UCR are the upper non-critical and critical thresholds;
	// LCR the lower critical one (a fan below it has stopped).
	UNC, UCR, LCR uint8
}

// sdr is the sensor's full sensor record (SDR type 01h) as ipmi_sim's
// main_sdr_add takes it.
func (s Sensor) sdr(recordID uint16) []byte {
	m := s.M
	if m == 0 {
		m = 1
	}
	name := []byte(s.Name)
	if len(name) > 16 {
		name = name[:16]
	}
	entity := map[uint8]uint8{0x01: 0x07, 0x04: 0x1d, 0x08: 0x0a, 0x03: 0x0a}[s.Type]
	if entity == 0 {
		entity = 0x07
	}
	r := []byte{
		byte(recordID), byte(recordID >> 8), 0x51, 0x01, 0, // header; length set below
		0x20, 0x00, s.Number, // owner, LUN, number
		entity, 0x01, // entity, instance
		0x7f,         // initialization: scanning and events on
		0x48,         // capabilities: auto re-arm, thresholds readable and settable
		s.Type, 0x01, // sensor type, threshold event/reading type
		0x84, 0x02, // assertion mask: lower C going low, upper NC and C going high
		0x84, 0x02, // deassertion mask
		0x1b, 0x1b, // readable, settable thresholds: LNC LC UNC UC (bits 0,1,3,4)
		0x00, s.Unit, 0x00, // units: unsigned, base unit, no modifier
		0x00,    // linear
		m, 0x00, // M, tolerance
		0x00, 0x00, // B, accuracy
		0x00, 0x00, // accuracy, direction; R and B exponents
		0x00, 0x00, 0x00, 0x00, // analog flags, nominal, normal max, normal min
		0xff, 0x00, // sensor max, min
		0xff, s.UCR, s.UNC, // upper NR, C, NC
		0x00, s.LCR, 0x00, // lower NR, C, NC
		0x00, 0x00, // hysteresis
		0x00, 0x00, 0x00, // reserved, OEM
		0xc0 | byte(len(name)),
	}
	r = append(r, name...)
	r[4] = byte(len(r) - 5)
	return r
}

// emu is the sensor's ipmi_sim commands: its SDR, the sensor, its
// thresholds and its first reading.
func (s Sensor) emu(recordID uint16) string {
	var b strings.Builder
	b.WriteString("main_sdr_add 0x20")
	for _, x := range s.sdr(recordID) {
		fmt.Fprintf(&b, " 0x%02x", x)
	}
	fmt.Fprintf(&b, "\nsensor_add 0x20 0 %d 0x%02x 0x01\n", s.Number, s.Type)
	// value5..value0: UNR UCR UNC LNR LCR LNC; enabled: UCR UNC LCR.
	fmt.Fprintf(&b, "sensor_set_threshold 0x20 0 %d settable 011010 0 %d %d 0 %d 0\n", s.Number, s.UCR, s.UNC, s.LCR)
	// 15 event bits, bit 14 first: 9 upper critical going high, 7 upper
	// non-critical going high, 2 lower critical going low.
	fmt.Fprintf(&b, "sensor_set_event_support 0x20 0 %d enable scanning per-state %[2]s %[2]s %[2]s %[2]s\n", s.Number, "000001010000100")
	fmt.Fprintf(&b, "sensor_set_value 0x20 0 %d %d 0\n", s.Number, s.Raw)
	return b.String()
}

// StartWithSensors runs ipmi_sim like Start (no VM) with sensors in its
// SDR repository, a System Event Log, and a command console on a
// loopback TCP port for Emu (changing a reading, adding a log entry
// while it runs).
func StartWithSensors(t testing.TB, o Options, sensors []Sensor) *BMC {
	t.Helper()
	require.Tool(t, "ipmi_sim")
	if o.VM {
		t.Fatal("ipmisim: StartWithSensors has no VM")
	}
	if o.User == "" {
		o.User = "admin"
	}
	if o.Password == "" {
		o.Password = "secret"
	}
	dir, err := os.MkdirTemp("", "ipmisim-")
	if err != nil {
		t.Fatal(err)
	}
	b := &BMC{Dir: dir, User: o.User, Pass: o.Password}
	if err := os.WriteFile(filepath.Join(dir, "chassis"), []byte(chassisScript(dir, o, 0, 0)), 0o755); err != nil {
		t.Fatal(err)
	}
	emu := simconf.Emu + "sel_enable 0x20 1000 0x0a\n"
	for i, s := range sensors {
		emu += s.emu(uint16(i + 1))
	}
	if err := os.WriteFile(filepath.Join(dir, "sim.emu"), []byte(emu), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.launch(t, dir, func(port int) string {
		console := FreeTCPPort(t)
		consoles.Store(b, console)
		return lanConf(dir, port, 0, o) + fmt.Sprintf("console 127.0.0.1 %d\n", console)
	})
	t.Cleanup(func() { b.stop(); consoles.Delete(b) })
	return b
}

// Emu runs ipmi_sim commands (ipmi_sim_cmd(5)) on the console of a BMC
// started by StartWithSensors, one a line, and returns what it printed.
func (b *BMC) Emu(commands ...string) (string, error) {
	port, ok := consoles.Load(b)
	if !ok {
		return "", fmt.Errorf("ipmisim: this BMC has no console (StartWithSensors)")
	}
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port.(int)), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var out strings.Builder
	r := bufio.NewReader(c)
	prompt := func() {
		// The console prints "> " when it waits for a command.
		for {
			s, err := r.ReadString(' ')
			out.WriteString(s)
			if err != nil || strings.HasSuffix(s, "> ") {
				return
			}
		}
	}
	prompt()
	for _, cmd := range commands {
		if _, err := fmt.Fprintf(c, "%s\n", cmd); err != nil {
			return out.String(), err
		}
		prompt()
	}
	return out.String(), nil
}
