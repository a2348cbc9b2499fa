package commission

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Results of one test (inventoryv1.CommissionTest.Result).
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip"
)

// MaxOutput bounds the output excerpt a test reports (the appliance bounds
// it again where it arrives).
const MaxOutput = 4 << 10

// Verdict is what a parser makes of a tool's output: its result and a
// one-line summary. Value is the measurement a threshold compares
// (MB/s, bogo ops/s, Mb/s), 0 when the tool has none.
type Verdict struct {
	Result  string
	Summary string
	Value   float64
}

// smartctl's exit status bits (smartctl(8), "RETURN VALUES").
const (
	smartCmdLine    = 1 << 0 // the command line did not parse
	smartOpen       = 1 << 1 // the device did not open or its type is unknown
	smartCmdFailed  = 1 << 2 // a SMART or ATA command failed
	smartFailing    = 1 << 3 // SMART status: DISK FAILING
	smartPrefail    = 1 << 4 // prefail attributes at or below threshold
	smartSelfTestKO = 1 << 7 // the self-test log holds errors
)

// ParseSmart reads `smartctl -H -j DEV` (with exit status code): a device
// that does not answer SMART (a virtio disk, a USB bridge) is a skip; a
// failing health status, a failing attribute or a failed self-test fails.
func ParseSmart(out []byte, code int) Verdict {
	var doc struct {
		Smartctl struct {
			Messages []struct {
				String   string `json:"string"`
				Severity string `json:"severity"`
			} `json:"messages"`
			ExitStatus int `json:"exit_status"`
		} `json:"smartctl"`
		Device struct {
			Name     string `json:"name"`
			Protocol string `json:"protocol"`
		} `json:"device"`
		ModelName   string `json:"model_name"`
		SmartStatus *struct {
			Passed bool `json:"passed"`
		} `json:"smart_status"`
	}
	if err := json.Unmarshal(jsonPart(out), &doc); err != nil {
		return Verdict{Result: Fail, Summary: fmt.Sprintf("smartctl output unreadable (exit %d): %v", code, err)}
	}
	var msgs []string
	for _, m := range doc.Smartctl.Messages {
		msgs = append(msgs, m.String)
	}
	msg := strings.Join(msgs, "; ")
	model := strings.TrimSpace(doc.ModelName + " " + doc.Device.Protocol)
	switch {
	case doc.SmartStatus == nil && code&(smartCmdLine|smartOpen|smartCmdFailed) != 0:
		return Verdict{Result: Skip, Summary: "no SMART: " + firstNonEmpty(msg, fmt.Sprintf("smartctl exit %d", code))}
	case doc.SmartStatus != nil && !doc.SmartStatus.Passed, code&smartFailing != 0:
		return Verdict{Result: Fail, Summary: "SMART health FAILED " + model}
	case code&smartPrefail != 0:
		return Verdict{Result: Fail, Summary: "SMART prefail attribute at or below its threshold " + model}
	case code&smartSelfTestKO != 0:
		return Verdict{Result: Fail, Summary: "SMART self-test log holds errors " + model}
	case doc.SmartStatus == nil:
		return Verdict{Result: Skip, Summary: "no SMART status: " + firstNonEmpty(msg, fmt.Sprintf("smartctl exit %d", code))}
	}
	return Verdict{Result: Pass, Summary: strings.TrimSpace("SMART health PASSED " + model)}
}

// memtester's exit status bits (memtester(8)).
const (
	memAlloc = 1 << 0 // could not allocate or lock the memory
	memStuck = 1 << 1 // the stuck address test failed
	memOther = 1 << 2 // another test failed
)

// ParseMemtester reads memtester's output (rendered: Render) and exit
// status.
func ParseMemtester(out string, code int) Verdict {
	var ok, failed []string
	for _, l := range strings.Split(out, "\n") {
		name, rest, found := strings.Cut(l, ":")
		if !found || !strings.HasPrefix(l, "  ") {
			continue
		}
		name = strings.TrimSpace(name)
		switch r := strings.TrimSpace(rest); {
		case strings.HasSuffix(r, "ok"):
			ok = append(ok, name)
		case strings.Contains(r, "FAILURE"):
			failed = append(failed, name)
		}
	}
	switch {
	case code&memAlloc != 0:
		return Verdict{Result: Fail, Summary: fmt.Sprintf("memtester could not allocate or lock its memory (exit %d)", code)}
	case code&(memStuck|memOther) != 0 || len(failed) > 0:
		return Verdict{Result: Fail, Summary: fmt.Sprintf("memtester: %d tests failed: %s (exit %d)", len(failed), strings.Join(failed, ", "), code)}
	case code != 0:
		return Verdict{Result: Fail, Summary: fmt.Sprintf("memtester exit %d", code)}
	case len(ok) == 0:
		return Verdict{Result: Fail, Summary: "memtester reported no test"}
	}
	return Verdict{Result: Pass, Summary: fmt.Sprintf("memtester: %d tests ok", len(ok)), Value: float64(len(ok))}
}

// ParseStressNG reads `stress-ng --cpu N --metrics-brief` (its stderr and
// stdout together): the cpu stressor's bogo ops per second (real time).
func ParseStressNG(out string, code int) Verdict {
	var rate float64
	found := false
	for _, l := range strings.Split(out, "\n") {
		_, rest, ok := strings.Cut(l, "] ")
		if !ok || !strings.Contains(l, "metrc:") {
			continue
		}
		f := strings.Fields(rest)
		// stressor, bogo ops, real, usr, sys, bogo ops/s (real), bogo ops/s (usr+sys)
		if len(f) >= 6 && f[0] == "cpu" {
			if v, err := strconv.ParseFloat(f[5], 64); err == nil {
				rate, found = v, true
			}
		}
	}
	switch {
	case code != 0:
		return Verdict{Result: Fail, Summary: fmt.Sprintf("stress-ng exit %d", code), Value: rate}
	case !found:
		return Verdict{Result: Fail, Summary: "stress-ng reported no cpu metrics"}
	}
	return Verdict{Result: Pass, Summary: fmt.Sprintf("cpu %.0f bogo ops/s", rate), Value: rate}
}

// ParseFio reads `fio --output-format=json` of one read job: its read
// rate in MB/s (10^6 bytes).
func ParseFio(out []byte, code int) Verdict {
	var doc struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				IOBytes int64 `json:"io_bytes"`
				BW      int64 `json:"bw_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(jsonPart(out), &doc); err != nil || len(doc.Jobs) == 0 {
		return Verdict{Result: Fail, Summary: fmt.Sprintf("fio output unreadable (exit %d)", code)}
	}
	j := doc.Jobs[0]
	mbps := float64(j.Read.BW) / 1e6
	switch {
	case code != 0 || j.Error != 0:
		return Verdict{Result: Fail, Summary: fmt.Sprintf("fio read failed: error %d (exit %d)", j.Error, code)}
	case j.Read.IOBytes == 0:
		return Verdict{Result: Fail, Summary: "fio read nothing"}
	}
	return Verdict{Result: Pass, Summary: fmt.Sprintf("read %.1f MB/s (%d MB)", mbps, j.Read.IOBytes/1e6), Value: mbps}
}

// Link is a NIC's link as the kernel reports it in sysfs.
type Link struct {
	Carrier bool
	Speed   int64  // Mb/s; -1 unknown
	Duplex  string // "full", "half", "unknown"
}

// ParseLink reads a NIC's sysfs carrier, speed and duplex files (their
// contents; a read error is ""): the kernel's own numbers, which ethtool
// also prints.
func ParseLink(carrier, speed, duplex string) Link {
	l := Link{Carrier: strings.TrimSpace(carrier) == "1", Speed: -1, Duplex: strings.TrimSpace(duplex)}
	if v, err := strconv.ParseInt(strings.TrimSpace(speed), 10, 64); err == nil && v > 0 {
		l.Speed = v
	}
	if l.Duplex == "" {
		l.Duplex = "unknown"
	}
	return l
}

// Judge checks a link against a step's thresholds.
func (l Link) Judge(minMbps uint64, fullDuplex bool) Verdict {
	speed := "speed unknown"
	if l.Speed > 0 {
		speed = fmt.Sprintf("%d Mb/s", l.Speed)
	}
	desc := fmt.Sprintf("%s, %s duplex", speed, l.Duplex)
	switch {
	case !l.Carrier:
		return Verdict{Result: Fail, Summary: "no link"}
	case minMbps > 0 && (l.Speed < 0 || uint64(l.Speed) < minMbps):
		return Verdict{Result: Fail, Summary: fmt.Sprintf("link up, %s: below %d Mb/s", desc, minMbps), Value: float64(l.Speed)}
	case fullDuplex && l.Duplex != "full":
		return Verdict{Result: Fail, Summary: "link up, " + desc + ": not full duplex", Value: float64(l.Speed)}
	}
	return Verdict{Result: Pass, Summary: "link up, " + desc, Value: float64(l.Speed)}
}

// Render turns a tool's output into text as a terminal would show it:
// a backspace takes back the character before it on its line (memtester
// draws its progress with them), a carriage return starts the line again (CRLF is a newline);
// invalid UTF-8 is replaced.
func Render(b []byte) string {
	var out []rune
	lineStart := 0
	for _, r := range strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\r\n", "\n") {
		switch r {
		case '\b':
			if len(out) > lineStart {
				out = out[:len(out)-1]
			}
		case '\r':
			out = out[:lineStart]
		case '\n':
			out = append(out, r)
			lineStart = len(out)
		default:
			out = append(out, r)
		}
	}
	return string(out)
}

// Excerpt bounds s to limit bytes of valid UTF-8: its head and its tail
// (where tools print their verdict) around a marker.
func Excerpt(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= limit {
		return s
	}
	const mark = "\n[…]\n"
	head := (limit - len(mark)) / 4
	tail := limit - len(mark) - head
	h, t := s[:head], s[len(s)-tail:]
	for len(h) > 0 && !utf8.ValidString(h) {
		h = h[:len(h)-1]
	}
	for len(t) > 0 && !utf8.ValidString(t) {
		t = t[1:]
	}
	return h + mark + t
}

// jsonPart is out from its first '{' (fio prints warnings before its
// JSON).
func jsonPart(out []byte) []byte {
	if i := bytes.IndexByte(out, '{'); i > 0 {
		return out[i:]
	}
	return out
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
