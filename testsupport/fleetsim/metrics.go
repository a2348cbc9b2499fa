package fleetsim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// histogram is one Prometheus histogram series: cumulative buckets.
type histogram struct {
	les    []float64
	counts []float64
	sum    float64
	count  float64
}

// quantile estimates q from the buckets (the upper bound of the bucket
// holding it, as histogram_quantile would interpolate inside it).
func (h *histogram) quantile(q float64) float64 {
	if h.count == 0 {
		return 0
	}
	rank := q * h.count
	prevLE, prevC := 0.0, 0.0
	for i, le := range h.les {
		if h.counts[i] >= rank {
			if math.IsInf(le, 1) {
				return prevLE
			}
			if h.counts[i] == prevC {
				return le
			}
			return prevLE + (le-prevLE)*(rank-prevC)/(h.counts[i]-prevC)
		}
		prevLE, prevC = le, h.counts[i]
	}
	return prevLE
}

// metricsText is the parsed /metrics: histograms by name{labels without
// le}, and plain samples by name{labels}.
type metricsText struct {
	hists   map[string]*histogram
	samples map[string]float64
}

func parseMetrics(r io.Reader) (*metricsText, error) {
	m := &metricsText{hists: map[string]*histogram{}, samples: map[string]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		series := line[:i]
		name, labels := series, ""
		if j := strings.IndexByte(series, '{'); j >= 0 {
			name, labels = series[:j], strings.Trim(series[j:], "{}")
		}
		var le string
		var rest []string
		for _, l := range splitLabels(labels) {
			if strings.HasPrefix(l, "le=") {
				le = strings.Trim(l[3:], `"`)
			} else if l != "" {
				rest = append(rest, l)
			}
		}
		key := func(base string) string { return base + "{" + strings.Join(rest, ",") + "}" }
		switch {
		case strings.HasSuffix(name, "_bucket") && le != "":
			h := m.hist(key(strings.TrimSuffix(name, "_bucket")))
			f, err := strconv.ParseFloat(le, 64)
			if err != nil {
				continue
			}
			h.les = append(h.les, f)
			h.counts = append(h.counts, v)
		case strings.HasSuffix(name, "_sum") && m.hists[key(strings.TrimSuffix(name, "_sum"))] != nil:
			m.hist(key(strings.TrimSuffix(name, "_sum"))).sum = v
		case strings.HasSuffix(name, "_count") && m.hists[key(strings.TrimSuffix(name, "_count"))] != nil:
			m.hist(key(strings.TrimSuffix(name, "_count"))).count = v
		default:
			m.samples[key(name)] = v
		}
	}
	return m, sc.Err()
}

func (m *metricsText) hist(k string) *histogram {
	h := m.hists[k]
	if h == nil {
		h = &histogram{}
		m.hists[k] = h
	}
	return h
}

// splitLabels splits a{b="x,y",c="z"}'s inside on the commas between
// labels (values may hold commas).
func splitLabels(s string) []string {
	var out []string
	inQ, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			inQ = !inQ
		case ',':
			if !inQ {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// QueueLine is one row of "where it queues": a histogram's count, mean,
// p50 and p99 (estimated from the buckets).
type QueueLine struct {
	Series              string
	Count               float64
	Mean, P50, P99, Sum float64 // seconds
}

// queueFigures picks the series that tell where a storm queues: API
// handling time by method, store commits, boot HTTP, boot phases; and
// the DHCP packet outcomes.
func queueFigures(path string) ([]QueueLine, map[string]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	m, err := parseMetrics(f)
	if err != nil {
		return nil, nil, err
	}
	var out []QueueLine
	for k, h := range m.hists {
		if !strings.HasPrefix(k, "corral_") || h.count == 0 {
			continue
		}
		out = append(out, QueueLine{Series: strings.TrimPrefix(k, "corral_"), Count: h.count, Sum: h.sum, Mean: h.sum / h.count,
			P50: h.quantile(0.5), P99: h.quantile(0.99)})
	}
	slices.SortFunc(out, func(a, b QueueLine) int { return strings.Compare(a.Series, b.Series) })
	counters := map[string]float64{}
	for k, v := range m.samples {
		if strings.HasPrefix(k, "corral_dhcp_") || strings.HasPrefix(k, "corral_boot_http_requests_total") ||
			strings.HasPrefix(k, "corral_timeline_") || strings.Contains(k, "dropped") {
			counters[strings.TrimPrefix(k, "corral_")] = v
		}
	}
	return out, counters, nil
}

func fmtSeconds(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 1e-3:
		return fmt.Sprintf("%.0fµs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1fms", s*1e3)
	}
	return fmt.Sprintf("%.2fs", s)
}
