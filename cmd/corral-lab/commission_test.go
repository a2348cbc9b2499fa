package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// commissioned is the part of a Machine record the commissioning test
// reads.
type commissioned struct {
	State      string `json:"state"`
	Commission struct {
		Profile string `json:"profile"`
		Status  string `json:"status"`
		Error   string `json:"error"`
		Cleared bool   `json:"cleared"`
		Tests   []struct {
			Name    string `json:"name"`
			Target  string `json:"target"`
			Result  string `json:"result"`
			Summary string `json:"summary"`
			Output  string `json:"output"`
		} `json:"tests"`
	} `json:"commission"`
}

// checkCommissioning: commissioning in the virtual rack
// (docs/operator-guide.md, "Commissioning"), run by TestLabDeploy on two
// of its inventoried machines before they are accepted: good has NVMe
// disks (QEMU's answer SMART), bad virtio ones. Their discovery agents
// booted without the commissioning overlay, so each fetches it from the
// plan's URL and unpacks it. good passes the quick profile with the real
// tools (SMART health of each NVMe disk, memtester, stress-ng, fio, the
// NIC's link); bad runs link-10g at the same time, whose 10 Gb/s
// full-duplex link QEMU's virtio NIC does not report: it fails, and is
// refused for accept until `corral machine commission clear` lets it
// through (the caller then accepts both). Prints each profile's time
// under TCG (bench/README.md, "Commissioning").
func checkCommissioning(t *testing.T, r *rack, good, bad string) {
	t.Helper()
	get := func(name string) commissioned {
		var m commissioned
		if err := json.Unmarshal(r.mustCorral("get", "machine", name, "-o", "json"), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}

	// Both at once: the link-10g run goes first, without --wait.
	t0 := time.Now()
	r.mustCorral("machine", "commission", bad, "--profile", "link-10g")
	out, err := r.corral("--timeout", "8m", "machine", "commission", good, "--profile", "quick", "--wait")
	quick := time.Since(t0)
	if err != nil {
		r.logs()
		t.Fatalf("commission %s quick: %v\n%s", good, err, out)
	}
	t.Logf("commissioning, profile quick, TCG (overlay fetched and unpacked by the agent), beside the link-10g one: %s\n%s", quick.Round(time.Second), out)
	m := get(good)
	seen := map[string]int{}
	for _, ct := range m.Commission.Tests {
		seen[ct.Name]++
		if ct.Result == "fail" {
			t.Errorf("%s %s failed: %s\n%s", ct.Name, ct.Target, ct.Summary, ct.Output)
		}
		if ct.Name == "smart" && (ct.Result != "pass" || !strings.Contains(ct.Summary, "PASSED")) {
			t.Errorf("SMART of %s: %s %s (QEMU's NVMe answers SMART)", ct.Target, ct.Result, ct.Summary)
		}
		if len(ct.Output) > 4096 {
			t.Errorf("%s %s: output of %d bytes", ct.Name, ct.Target, len(ct.Output))
		}
	}
	if m.Commission.Status != "passed" || seen["smart"] < 1 || seen["fio"] < 1 || seen["memtester"] != 1 || seen["stress-ng"] != 1 || seen["link"] < 1 {
		t.Fatalf("%s: commissioning %s, tests %v", good, m.Commission.Status, seen)
	}

	r.waitFor("the link-10g commissioning to finish", 8*time.Minute, func() bool {
		s := get(bad).Commission.Status
		return s == "passed" || s == "failed"
	})
	t.Logf("commissioning, profile link-10g, TCG, beside the quick one: %s", time.Since(t0).Round(time.Second))
	m = get(bad)
	if m.Commission.Status != "failed" || !strings.Contains(m.Commission.Error, "link") {
		t.Fatalf("%s: commissioning %s: %s", bad, m.Commission.Status, m.Commission.Error)
	}
	if out, err := r.corral("machine", "accept", bad, "--target", "pool"); err == nil || !strings.Contains(string(out), "failed commissioning") {
		t.Fatalf("accept of a machine that failed commissioning: %v\n%s", err, out)
	}
	if out, err := r.corral("describe", "machine", bad); err != nil || !strings.Contains(string(out), "# commissioning") || !strings.Contains(string(out), "below 10000 Mb/s") {
		t.Fatalf("describe: %v\n%s", err, out)
	}
	r.mustCorral("machine", "commission", "clear", bad)
	if m := get(bad); !m.Commission.Cleared {
		t.Fatalf("after clear: cleared %v", m.Commission.Cleared)
	}
}
