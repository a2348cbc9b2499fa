package fleet

import (
	"fmt"
	"net/netip"
	"strings"
)

// candidate is a live runner as placement sees it.
type candidate struct {
	name     string
	bmcNets  []netip.Prefix // empty: reaches any BMC
	bootSegs []netip.Prefix // empty: serves any segment
	assigned int
}

// target is what placement knows of a machine: its BMC host and its last
// boot address (either invalid when unknown).
type target struct {
	bmc, boot netip.Addr
}

// match scores how well c suits t: ok=false when one of c's non-empty
// lists excludes t's known address; score counts the non-empty lists that
// contain it (0: c serves any). via names the matched networks.
func (c *candidate) match(t target) (ok bool, score int, via []string) {
	if len(c.bmcNets) > 0 && t.bmc.IsValid() {
		p, hit := containing(c.bmcNets, t.bmc)
		if !hit {
			return false, 0, nil
		}
		score++
		via = append(via, "bmc network "+p.String())
	}
	if len(c.bootSegs) > 0 && t.boot.IsValid() {
		p, hit := containing(c.bootSegs, t.boot)
		if !hit {
			return false, 0, nil
		}
		score++
		via = append(via, "boot segment "+p.String())
	}
	return true, score, via
}

func containing(nets []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	a = a.Unmap()
	for _, p := range nets {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// place picks the runner for t among cands: affinity first (the runners
// whose networks contain the machine's BMC and boot addresses, the most
// specific match winning over a runner that serves any), then the least
// assigned, ties by name. When no runner's networks admit the machine, it
// goes to the least assigned of all, and the reason says so. cands must
// not be empty; the chosen candidate's assigned count is incremented.
func place(cands []*candidate, t target) (*candidate, string) {
	var best []*candidate
	bestScore := -1
	for _, c := range cands {
		ok, score, _ := c.match(t)
		switch {
		case !ok || score < bestScore:
		case score > bestScore:
			best, bestScore = []*candidate{c}, score
		default:
			best = append(best, c)
		}
	}
	prefix := ""
	if len(best) == 0 {
		best = cands
		var what []string
		if t.bmc.IsValid() {
			what = append(what, "bmc "+t.bmc.String())
		}
		if t.boot.IsValid() {
			what = append(what, "boot address "+t.boot.String())
		}
		prefix = fmt.Sprintf("no live runner's networks contain %s: ", strings.Join(what, " and "))
	}
	pick := best[0]
	for _, c := range best[1:] {
		if c.assigned < pick.assigned || (c.assigned == pick.assigned && c.name < pick.name) {
			pick = c
		}
	}
	pick.assigned++
	if bestScore > 0 && prefix == "" {
		_, _, via := pick.match(t)
		r := "affinity: " + strings.Join(via, " and ")
		if len(best) > 1 {
			r += fmt.Sprintf(" (least loaded of %d)", len(best))
		}
		return pick, r
	}
	return pick, prefix + fmt.Sprintf("least loaded of %d", len(best))
}
