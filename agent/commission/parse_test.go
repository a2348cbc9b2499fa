package commission

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The testdata outputs were captured on a Debian 12 host (2026-11-29)
// with the tools the overlay carries: smartctl 7.3 on a virtio disk and on
// a plain file (neither answers SMART), memtester 4.6.0 over 16 MiB once,
// stress-ng with one CPU worker for 3 s, fio 3.33 reading a 64 MiB loop
// device read-only for 2 s and a device that does not exist, ethtool and
// sysfs on a virtio NIC (speed and duplex unknown).
func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseSmartNoSMART(t *testing.T) {
	for _, f := range []string{"smartctl-health-virtio.json", "smartctl-file.json"} {
		v := ParseSmart(read(t, f), 1)
		if v.Result != Skip || !strings.Contains(v.Summary, "no SMART") {
			t.Errorf("%s: %+v, want a skip", f, v)
		}
	}
	if v := ParseSmart(read(t, "smartctl-health-virtio.json"), 1); !strings.Contains(v.Summary, "Unable to detect device type") {
		t.Errorf("summary %q does not carry smartctl's message", v.Summary)
	}
}

func TestParseSmartStatus(t *testing.T) {
	// smartctl's JSON for a device that answered; the exit bits decide
	// alongside smart_status.
	ok := []byte(`{"smartctl":{"exit_status":0},"device":{"name":"/dev/nvme0","protocol":"NVMe"},"model_name":"QEMU NVMe Ctrl","smart_status":{"passed":true}}`)
	bad := []byte(`{"smartctl":{"exit_status":8},"device":{"name":"/dev/nvme0","protocol":"NVMe"},"smart_status":{"passed":false}}`)
	for _, c := range []struct {
		out  []byte
		code int
		want string
	}{
		{ok, 0, Pass}, {bad, 8, Fail}, {ok, smartPrefail, Fail}, {ok, smartSelfTestKO, Fail}, {[]byte("garbage"), 2, Fail},
	} {
		if v := ParseSmart(c.out, c.code); v.Result != c.want {
			t.Errorf("exit %d: %+v, want %s", c.code, v, c.want)
		}
	}
}

func TestParseMemtester(t *testing.T) {
	text := Render(read(t, "memtester-16M.txt"))
	if strings.Contains(text, "\b") {
		t.Fatal("backspaces left after Render")
	}
	v := ParseMemtester(text, 0)
	if v.Result != Pass || v.Value != 18 {
		t.Fatalf("%+v, want a pass of 18 tests", v)
	}
	if !strings.Contains(text, "  Stuck Address       : ok") {
		t.Errorf("rendered output lacks the clean Stuck Address line:\n%s", Excerpt(text, 600))
	}
	if v := ParseMemtester(text, memOther); v.Result != Fail {
		t.Errorf("exit %d: %+v, want a failure", memOther, v)
	}
	failed := strings.Replace(text, "  Compare XOR         : ok", "  Compare XOR         : FAILURE: 0x12 != 0x13 at offset 0x40.", 1)
	if v := ParseMemtester(failed, 0); v.Result != Fail || !strings.Contains(v.Summary, "Compare XOR") {
		t.Errorf("a FAILURE line: %+v", v)
	}
	if v := ParseMemtester(text, memAlloc); v.Result != Fail || !strings.Contains(v.Summary, "allocate") {
		t.Errorf("exit 1: %+v", v)
	}
}

func TestParseStressNG(t *testing.T) {
	out := string(read(t, "stress-ng-cpu.txt"))
	v := ParseStressNG(out, 0)
	if v.Result != Pass || v.Value != 1258.06 {
		t.Fatalf("%+v, want a pass at 1258.06 bogo ops/s", v)
	}
	if v := ParseStressNG(out, 2); v.Result != Fail {
		t.Errorf("exit 2: %+v", v)
	}
	if v := ParseStressNG("stress-ng: info: nothing", 0); v.Result != Fail {
		t.Errorf("no metrics: %+v", v)
	}
}

func TestParseFio(t *testing.T) {
	v := ParseFio(read(t, "fio-read.json"), 0)
	if v.Result != Pass || v.Value < 4168 || v.Value > 4169 {
		t.Fatalf("%+v, want a pass at 4168.1 MB/s", v)
	}
	// fio's warnings come before its JSON.
	if v := ParseFio(read(t, "fio-missing.json"), 1); v.Result != Fail || !strings.Contains(v.Summary, "error 22") {
		t.Errorf("missing device: %+v", v)
	}
	if v := ParseFio([]byte("fio: no such option"), 1); v.Result != Fail {
		t.Errorf("no JSON: %+v", v)
	}
}

func TestParseLink(t *testing.T) {
	f := strings.Fields(string(read(t, "sysfs-eth0.txt"))) // "-1 unknown"
	l := ParseLink("1\n", f[0], f[1])
	if l.Speed != -1 || l.Duplex != "unknown" || !l.Carrier {
		t.Fatalf("%+v", l)
	}
	if v := l.Judge(0, false); v.Result != Pass || v.Summary != "link up, speed unknown, unknown duplex" {
		t.Errorf("no threshold: %+v", v)
	}
	if v := l.Judge(10000, false); v.Result != Fail {
		t.Errorf("10G wanted of an unknown speed: %+v", v)
	}
	if v := ParseLink("1", "1000", "full").Judge(1000, true); v.Result != Pass {
		t.Errorf("1000 full: %+v", v)
	}
	if v := ParseLink("1", "1000", "half").Judge(0, true); v.Result != Fail {
		t.Errorf("half duplex: %+v", v)
	}
	if v := ParseLink("0", "", "").Judge(0, false); v.Result != Fail || v.Summary != "no link" {
		t.Errorf("no carrier: %+v", v)
	}
	if !strings.Contains(string(read(t, "ethtool-eth0.txt")), "Link detected: yes") {
		t.Error("ethtool capture changed")
	}
}

func TestExcerptBounded(t *testing.T) {
	s := strings.Repeat("é", 5000) + "verdict: ok"
	e := Excerpt(s, MaxOutput)
	if len(e) > MaxOutput || !strings.HasSuffix(e, "verdict: ok") || !strings.Contains(e, "[…]") {
		t.Fatalf("excerpt %d bytes, tail %q", len(e), e[len(e)-20:])
	}
	if got := Excerpt("short\xff", MaxOutput); got != "short\uFFFD" {
		t.Errorf("invalid UTF-8: %q", got)
	}
	if got := Render([]byte("ab\bc\r\nx\ry\n")); got != "ac\ny\n" {
		t.Errorf("Render: %q", got)
	}
}
