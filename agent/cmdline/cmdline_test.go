package cmdline

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var good = Params{
	Endpoint:      "10.0.0.1:20180",
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
		"none":      {line: "console=ttyS0 quiet", missing: true},
		"bootif":    {line: "corral.endpoint=a:1 corral.token=t corral.ca=" + good.CAFingerprint + " BOOTIF=01-52-54-00-AA-BB-CC", mac: "52:54:00:aa:bb:cc"},
		"mac wins":  {line: "BOOTIF=01-52-54-00-aa-bb-cc corral.endpoint=a:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", mac: "52:54:00:00:00:01"},
		"bad ca":    {line: "corral.endpoint=a:1 corral.token=t corral.ca=zz corral.mac=52:54:00:00:00:01", wantErr: true},
		"no port":   {line: "corral.endpoint=a corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", wantErr: true},
		"bad token": {line: "corral.endpoint=a:1 corral.token=a\"b corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01", wantErr: true},
		"bad mode":  {line: "corral.endpoint=a:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01 corral.mode=x", wantErr: true},
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
	p.Endpoint = strings.Repeat("h", 2100) + ":1"
	if _, err := p.Format(); err == nil {
		t.Fatal("over-long command line accepted")
	}
}

func FuzzParse(f *testing.F) {
	f.Add("corral.endpoint=a:1 corral.token=t corral.ca=" + good.CAFingerprint + " corral.mac=52:54:00:00:00:01")
	f.Add("BOOTIF=01-52-54-00-aa-bb-cc")
	f.Fuzz(func(t *testing.T, line string) {
		p, err := Parse(line)
		if err == nil {
			if _, err := p.Format(); err != nil && len(line) < MaxLen {
				t.Fatalf("parsed params do not format: %v", err)
			}
		}
	})
}
