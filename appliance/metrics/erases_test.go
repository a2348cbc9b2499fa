package metrics

import "testing"

func TestEraseDoneCounts(t *testing.T) {
	o := New(Config{}, nil)
	done := o.EraseDone()
	done("full", "ok")
	done("full", "ok")
	done("secure", "failed")
	done("weird", "ok")
	fams, err := o.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "corral_erases_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["level"]+"/"+labels["outcome"]] = m.GetCounter().GetValue()
		}
	}
	for key, want := range map[string]float64{"full/ok": 2, "secure/failed": 1, "quick/timeout": 0, "other/ok": 1} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("corral_erases_total %s = %v (present %v), want %v", key, v, ok, want)
		}
	}
	if (*Metrics)(nil).EraseDone() != nil {
		t.Error("a nil *Metrics hands out a counter")
	}
}
