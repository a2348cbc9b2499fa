package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// standbyPool is the part of a StandbyPool record (proto JSON names) the
// standby check reads.
type standbyPool struct {
	Name     string `json:"name"`
	MinReady int    `json:"min_ready"`
	Status   struct {
		Ready         int      `json:"ready"`
		Booted        int      `json:"booted"`
		Allocated     int      `json:"allocated"`
		Deficit       int      `json:"deficit"`
		Warming       int      `json:"warming"`
		LastAction    string   `json:"last_action"`
		Conditions    []string `json:"conditions"`
		ReadyMachines []string `json:"ready_machines"`
	} `json:"status"`
}

func (r *rack) standbyPool(name string) standbyPool {
	r.t.Helper()
	var p standbyPool
	if err := json.Unmarshal(r.mustCorral("pool", "get", name, "-o", "json"), &p); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// powerOn reports whether the BMC reads machine name powered on
// ("lab-1: power ON (via native-ipmi)").
func (r *rack) powerOn(name string) bool {
	out, err := r.corral("machine", "power", "status", name)
	return err == nil && strings.Contains(string(out), "power ON")
}

// standbyGauge reads the standby pool gauge metric{pool="pool"} from the
// appliance's /metrics; -1 when it is not there.
func (r *rack) standbyGauge(metric, pool string) float64 {
	r.t.Helper()
	host, _, ok := strings.Cut(r.st.NSAddr, "/")
	if !ok {
		host = r.st.NSAddr
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + net.JoinHostPort(host, "9180") + "/metrics")
	if err != nil {
		r.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	want := fmt.Sprintf("%s{pool=%q} ", metric, pool)
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				r.t.Fatalf("/metrics: %s: %v", sc.Text(), err)
			}
			return f
		}
	}
	return -1
}

// applyStandbyPool writes a pool file and applies it.
func (r *rack) applyStandbyPool(name, readiness string, minReady int) {
	r.t.Helper()
	f := filepath.Join(r.dir, "pool-"+name+".yaml")
	body := fmt.Sprintf("name: %s\nmin_ready: %d\nreadiness: %q\n", name, minReady, readiness)
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.t.Logf("corral pool apply:\n%s", r.mustCorral("pool", "apply", "-f", f))
}

// checkStandbyPool proves standby pools on the rack (docs/operator-guide.md,
// "Standby pools"): machines are the names of free READY machines with
// BMCs, at least two. They are put in a powered-off pool with min_ready 1:
// every one is powered off through its BMC and counted ready; one is
// allocated and the pool still holds one; it is released. Then the same
// machines go to a booted pool with min_ready 1: exactly one is powered on
// into the discovery agent (its session open); that very machine is
// allocated and the pool refills by powering another on. The gauges on
// /metrics and `corral pool get` say the same. The machines are left
// READY and free, and the pools deleted.
func checkStandbyPool(t *testing.T, r *rack, machines []string) {
	r = r.in(t)
	if len(machines) < 2 {
		t.Fatalf("checkStandbyPool needs two free READY machines, got %v", machines)
	}
	n := len(machines)
	t0 := time.Now()

	// Powered off, commissioned.
	off := "standby-off"
	for _, m := range machines {
		r.mustCorral("label", "machine", m, "pool="+off)
	}
	r.applyStandbyPool(off, "off", 1)
	r.waitFor(fmt.Sprintf("pool %s: its %d machines powered off and counted ready", off, n), 6*time.Minute, func() bool {
		for _, m := range machines {
			if r.powerOn(m) {
				return false
			}
		}
		p := r.standbyPool(off)
		return p.Status.Ready == n && p.Status.Deficit == 0
	})
	if g := r.standbyGauge("corral_standby_pool_ready", off); g != float64(n) {
		t.Errorf("/metrics: corral_standby_pool_ready{pool=%q} %v, want %d", off, g, n)
	}
	if g := r.standbyGauge("corral_standby_pool_target", off); g != 1 {
		t.Errorf("/metrics: corral_standby_pool_target{pool=%q} %v, want 1", off, g)
	}
	var alloc []machine
	if err := json.Unmarshal(r.mustCorral("machine", "allocate", "--pool", off, "-o", "json"), &alloc); err != nil || len(alloc) != 1 {
		t.Fatalf("allocate from %s: %v (%d machines)", off, err, len(alloc))
	}
	taken := alloc[0].Name
	r.waitFor(fmt.Sprintf("pool %s: %s allocated, %d still ready", off, taken, n-1), 2*time.Minute, func() bool {
		p := r.standbyPool(off)
		return p.Status.Allocated == 1 && p.Status.Ready == n-1 && p.Status.Deficit == 0
	})
	if r.powerOn(taken) {
		t.Errorf("%s: powered on by the powered-off pool after its allocation", taken)
	}
	r.mustCorral("machine", "release", taken, "--erase", "none")
	r.mustCorral("pool", "delete", off)
	t.Logf("powered-off pool: %s", time.Since(t0).Round(time.Second))

	// Booted into discovery.
	t0 = time.Now()
	booted := "standby-booted"
	for _, m := range machines {
		r.mustCorral("label", "machine", m, "pool="+booted)
	}
	r.applyStandbyPool(booted, "booted", 1)
	// on is the one machine of the pool the BMC reads ON.
	on := func() []string {
		var up []string
		for _, m := range machines {
			if r.powerOn(m) {
				up = append(up, m)
			}
		}
		return up
	}
	var first string
	r.waitFor(fmt.Sprintf("pool %s: one machine powered on, its agent connected", booted), 10*time.Minute, func() bool {
		p := r.standbyPool(booted)
		up := on()
		if p.Status.Booted != 1 || p.Status.Deficit != 0 || len(up) != 1 {
			return false
		}
		first = up[0]
		return true
	})
	t.Logf("pool %s:\n%s", booted, r.mustCorral("pool", "get", booted, "-o", "wide"))
	// The gauge reads the pool's record at each scrape; on a loaded
	// machine the agent's session may drop and come back in between (the
	// pool then counts the machine warming for a moment), so it is waited
	// for, not read once.
	r.waitFor(fmt.Sprintf("/metrics: corral_standby_pool_deficit{pool=%q} 0", booted), 2*time.Minute, func() bool {
		return r.standbyGauge("corral_standby_pool_deficit", booted) == 0
	})
	// Allocate the booted machine itself (an allocation picks any free
	// machine of the pool): the pool must boot another.
	r.mustCorral("label", "machine", first, "standby-pick=yes")
	r.mustCorral("machine", "allocate", "--pool", booted, "--selector", "label.standby-pick=yes")
	var second string
	warmed := false
	r.waitFor(fmt.Sprintf("pool %s refilled: another machine powered on, its agent connected", booted), 10*time.Minute, func() bool {
		p := r.standbyPool(booted)
		warmed = warmed || p.Status.Warming == 1
		if p.Status.Booted != 1 || p.Status.Allocated != 1 || p.Status.Deficit != 0 {
			return false
		}
		for _, m := range on() {
			if m != first {
				second = m
				return true
			}
		}
		return false
	})
	if !warmed {
		t.Errorf("pool %s: never counted the refilling machine as warming", booted)
	}
	p := r.standbyPool(booted)
	want := slices.DeleteFunc(slices.Clone(machines), func(m string) bool { return m == first })
	slices.Sort(want)
	if !slices.Equal(p.Status.ReadyMachines, want) {
		t.Errorf("pool %s: ready machines %v, want %v", booted, p.Status.ReadyMachines, want)
	}
	if p.Status.Ready != n-1 {
		t.Errorf("pool %s after the refill: ready %d, want %d", booted, p.Status.Ready, n-1)
	}
	if !strings.Contains(p.Status.LastAction, second) {
		t.Errorf("pool %s: last action %q, want the power-on of %s", booted, p.Status.LastAction, second)
	}
	if g := r.standbyGauge("corral_standby_pool_ready", booted); g != float64(n-1) {
		t.Errorf("/metrics: corral_standby_pool_ready{pool=%q} %v, want %d", booted, g, n-1)
	}
	// The gauge reads the pool's record at each scrape; on a loaded
	// machine the agent's session may drop and come back in between (the
	// pool then counts the machine warming for a moment), so it is waited
	// for, not read once.
	r.waitFor(fmt.Sprintf("/metrics: corral_standby_pool_deficit{pool=%q} 0", booted), 2*time.Minute, func() bool {
		return r.standbyGauge("corral_standby_pool_deficit", booted) == 0
	})
	tl := string(r.mustCorral("machine", "timeline", second))
	if !strings.Contains(tl, "standby-power-on") {
		t.Errorf("%s: no standby-power-on on the timeline:\n%s", second, tl)
	}
	t.Logf("booted pool, refill after the allocation of %s by %s: %s", first, second, time.Since(t0).Round(time.Second))
	r.mustCorral("label", "machine", first, "standby-pick-")
	r.mustCorral("machine", "release", first, "--erase", "none")
	r.mustCorral("pool", "delete", booted)
}

// TestLabStandby: two BIOS machines behind BMCs, accepted into the pool,
// prove standby pools (checkStandbyPool). TestLabDeploy runs the same
// check on its released machines; this one is for working on the pools
// alone and runs only with CORRAL_LAB_STANDBY=1.
func TestLabStandby(t *testing.T) {
	if os.Getenv("CORRAL_LAB_STANDBY") != "1" {
		t.Skip("TestLabDeploy runs the standby check; set CORRAL_LAB_STANDBY=1 to run it alone")
	}
	need(t)
	r := up(t, "--machines", "2", "--with-bmc", "--firmware", "bios,bios",
		"--accept=false", "--until", "inventoried", "--wait", "10m", "--memory", "1536")
	ms := r.machines()
	var names []string
	for _, lm := range r.st.Machines {
		r.mustCorral("machine", "accept", ms[lm.Name].Name, "--target", "pool")
		names = append(names, ms[lm.Name].Name)
	}
	t.Run("standby", func(t *testing.T) { checkStandbyPool(t, r, names) })
}
