package cmdline

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var good = Params{
	Endpoints:     []string{"10.0.0.1:20180", "appliance-b.rack2.example:20180", "[fd00::1]:20180"},
	Token:         "crl_0123456789abcdef_abcdefghijklmnopqrstuvwxyz234567abcdefghijklmnopqrst",
	CAFingerprint: strings.Repeat("ab", 32),
	MAC:           "52:54:00:12:34:56",
}

func TestRoundTrip(t *testing.T) {
	s, err := good.Format()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse("console=ttyS0 quiet " + s + " initrd=initrd.img")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(good, got); diff != "" {
		t.Fatal(diff)
	}
}

func TestParse(t *testing.T) {
	cases := map[string]struct {
		line    string
		wantErr bool
		missing bool
		mac     string
	}{
		"none":           {line: "console=ttyS0 quiet", missing: true},
		"bootif":         {line: "corral.endpoint=a:1 corral.token=t corral.ca=" + good.CAFingerprint + " BOOTIF=01-52-54-00-AA-BB-CC", mac: "52:54:00:aa:bb:cc"},
		"mac wins":       {line: "BOOTIF=01-52-54-00-aa-bb-cc corral.endpoint=a:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", mac: "52:54:00:00:00:01"},
		"bad ca":         {line: "corral.endpoint=a:1 corral.token=t corral.ca=zz corral.mac=52:54:00:00:00:01", wantErr: true},
		"no port":        {line: "corral.endpoint=a corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", wantErr: true},
		"bad token":      {line: "corral.endpoint=a:1 corral.token=a\"b corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", wantErr: true},
		"bad mode":       {line: "corral.endpoint=a:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01 corral.mode=x", wantErr: true},
		"9 endpoints":    {line: "corral.endpoint=a:1,b:1,c:1,d:1,e:1,f:1,g:1,h:1,i:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", wantErr: true},
		"empty endpoint": {line: "corral.endpoint=a:1,,b:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", wantErr: true},
		"bad endpoint":   {line: "corral.endpoint=a:1,b corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", wantErr: true},
		"last wins":      {line: "corral.endpoint=a:1,,b corral.endpoint=a:1,b:2 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", mac: "52:54:00:00:00:01"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := Parse(tc.line)
			switch {
			case tc.missing:
				if !errors.Is(err, ErrMissing) {
					t.Fatalf("want ErrMissing, got %v", err)
				}
			case tc.wantErr:
				if err == nil {
					t.Fatal("want an error")
				}
			default:
				if err != nil || p.MAC != tc.mac {
					t.Fatalf("got %+v, %v", p, err)
				}
			}
		})
	}
}

func TestFormatTooLong(t *testing.T) {
	p := good
	p.Token = strings.Repeat("a", 256)
	if _, err := p.Format(); err != nil {
		t.Fatalf("a 256-byte token must fit: %v", err)
	}
	p.Endpoints = []string{strings.Repeat("h", 2100) + ":1"}
	if _, err := p.Format(); err == nil {
		t.Fatal("over-long command line accepted")
	}
}

// longName is a valid DNS name of n bytes ending in the label tag.
func longName(n int, tag string) string {
	var b strings.Builder
	for rem := n - len(tag); rem > 0; {
		c := min(64, rem) // a label of up to 63 and its dot
		if rem-c == 1 {
			c-- // never leave one byte: a label needs two with its dot
		}
		b.WriteString(strings.Repeat("a", c-1) + ".")
		rem -= c
	}
	return b.String() + tag
}

// TestFormatEightLongNames: the 2 KiB budget holds with a full list.
// Eight endpoints of about 240 bytes fit beside a 256-byte token; eight
// names of 253 bytes (the DNS maximum) do not, and Format says so.
func TestFormatEightLongNames(t *testing.T) {
	for name, tc := range map[string]struct {
		hostLen int
		fits    bool
	}{
		"8 x 180-byte names":       {hostLen: 180, fits: true},
		"8 x 253-byte names (max)": {hostLen: 253, fits: false},
	} {
		t.Run(name, func(t *testing.T) {
			p := good
			p.Token = strings.Repeat("t", 256)
			p.Endpoints = nil
			for i := range MaxEndpoints {
				h := longName(tc.hostLen, fmt.Sprintf("n%d", i))
				if len(h) != tc.hostLen {
					t.Fatalf("made a %d-byte name, want %d", len(h), tc.hostLen)
				}
				p.Endpoints = append(p.Endpoints, h+":20180")
			}
			if err := p.Validate(); err != nil {
				t.Fatalf("8 long names invalid: %v", err)
			}
			s, err := p.Format()
			if !tc.fits {
				if err == nil || !strings.Contains(err.Error(), "over 2048") {
					t.Fatalf("Format = %d bytes, %v; want the budget error", len(s), err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("8 endpoints of %d-byte names: %d bytes of %d", tc.hostLen, len(s), MaxLen)
			got, err := Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(p.Endpoints, got.Endpoints); diff != "" {
				t.Error(diff)
			}
		})
	}
}

func TestParseEndpoints(t *testing.T) {
	nine := strings.TrimSuffix(strings.Repeat("10.0.0.1:1,", 4)+strings.Repeat("10.0.0.2:2,", 5), ",")
	for name, tc := range map[string]struct {
		v       string
		want    []string
		wantErr []string // every string must be in the error
	}{
		"one":           {v: "10.0.0.1:20180", want: []string{"10.0.0.1:20180"}},
		"order kept":    {v: "b.example:1,a.example:2,[fd00::2]:3", want: []string{"b.example:1", "a.example:2", "[fd00::2]:3"}},
		"repeat once":   {v: "a:1,b:2,a:1", want: []string{"a:1", "b:2"}},
		"eight":         {v: "a:1,b:1,c:1,d:1,e:1,f:1,g:1,h:1", want: []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1"}},
		"nine":          {v: nine, wantErr: []string{"9 endpoints, at most 8"}},
		"empty element": {v: "a:1,,b:2", wantErr: []string{"element 2: empty"}},
		"trailing ,":    {v: "a:1,", wantErr: []string{"element 2: empty"}},
		"empty value":   {v: "", wantErr: []string{"empty: want host:port"}},
		"no port":       {v: "a:1,appliance", wantErr: []string{`element 2: "appliance": want host:port`}},
		"bad port":      {v: "a:0", wantErr: []string{`port "0"`}},
		"port word":     {v: "a:http", wantErr: []string{`port "http"`}},
		"bad host":      {v: `a:1,x"y:2`, wantErr: []string{"element 2", "DNS name"}},
		"bad bracket":   {v: "[nothost]:1", wantErr: []string{"not an IP address"}},
		"bad zone":      {v: `[fe80::1%a"b]:1`, wantErr: []string{"IPv6 zone"}},
		"long label":    {v: strings.Repeat("a", 64) + ":1", wantErr: []string{"DNS name"}},
		"all refused":   {v: nine + ",,x", wantErr: []string{"11 endpoints", "element 10: empty", `element 11: "x": want host:port`}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseEndpoints(tc.v)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("ParseEndpoints(%q) = %v, want an error", tc.v, got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Error(diff)
			}
		})
	}
}

func TestValidateEndpoints(t *testing.T) {
	for name, eps := range map[string][]string{
		"none":  nil,
		"nine":  {"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1", "i:1"},
		"twice": {"a:1", "a:1"},
		"empty": {"a:1", ""},
		"space": {"a:1 b:2"},
		"comma": {"a:1,b:2"},
	} {
		p := good
		p.Endpoints = eps
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), KeyEndpoint) {
			t.Errorf("%s: Validate = %v, want an error naming %s", name, err, KeyEndpoint)
		}
		if _, err := p.Format(); err == nil {
			t.Errorf("%s: Format accepted %q", name, eps)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("corral.endpoint=a:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01")
	f.Add("BOOTIF=01-52-54-00-aa-bb-cc")
	f.Add("corral.endpoint=a:1,[fd00::1]:2,a:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01")
	f.Add("corral.endpoint=a:1,,b")
	f.Fuzz(func(t *testing.T, line string) {
		p, err := Parse(line)
		if err == nil {
			if _, err := p.Format(); err != nil && len(line) < MaxLen {
				t.Fatalf("parsed params do not format: %v", err)
			}
		}
	})
}

func TestLLDPWindow(t *testing.T) {
	tests := map[string]struct {
		line string
		want time.Duration
		ok   bool
		err  bool
	}{
		"absent":       {line: "console=ttyS0 corral.mac=52:54:00:00:00:01"},
		"set":          {line: "corral.lldp=35s", want: 35 * time.Second, ok: true},
		"off":          {line: "corral.lldp=0", ok: true},
		"last wins":    {line: "corral.lldp=1s corral.lldp=2s", want: 2 * time.Second, ok: true},
		"not a time":   {line: "corral.lldp=soon", ok: true, err: true},
		"negative":     {line: "corral.lldp=-1s", ok: true, err: true},
		"over the cap": {line: "corral.lldp=1h", ok: true, err: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok, err := LLDPWindow(tc.line)
			if got != tc.want || ok != tc.ok || (err != nil) != tc.err {
				t.Errorf("LLDPWindow(%q) = %v, %v, %v; want %v, %v, error %v", tc.line, got, ok, err, tc.want, tc.ok, tc.err)
			}
		})
	}
}

func TestIPv6Only(t *testing.T) {
	for _, c := range []struct {
		eps  []string
		want bool
	}{
		{[]string{"[fd78::1]:9443"}, true},
		{[]string{"[fd78::1]:9443", "[2001:db8::2]:9443"}, true},
		{[]string{"[fd78::1]:9443", "10.0.0.1:9443"}, false},
		{[]string{"[::ffff:10.0.0.1]:9443"}, false},
		{[]string{"corrald.example:9443"}, false},
		{[]string{"10.0.0.1:9443"}, false},
		{nil, false},
	} {
		if got := IPv6Only(c.eps); got != c.want {
			t.Errorf("IPv6Only(%q) = %v, want %v", c.eps, got, c.want)
		}
	}
}
