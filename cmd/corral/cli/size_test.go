package cli

import (
	"strconv"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := map[string]struct {
		want uint64
		ok   bool
	}{
		"0":                              {0, true},
		"1073741824":                     {1 << 30, true},
		"512MiB":                         {512 << 20, true},
		"512mib":                         {512 << 20, true},
		"1GiB":                           {1 << 30, true},
		"1Gi":                            {1 << 30, true},
		"10G":                            {10e9, true},
		"10GB":                           {10e9, true},
		"1.5GiB":                         {3 << 29, true},
		"0.5KiB":                         {512, true},
		"2T":                             {2e12, true},
		"1EiB":                           {1 << 60, true},
		"15EiB":                          {15 << 60, true},
		"18446744073709551615":           {1<<64 - 1, true},
		" 4K ":                           {4000, true},
		"64B":                            {64, true},
		"":                               {0, false},
		"GiB":                            {0, false},
		"-1":                             {0, false},
		"+1":                             {0, false},
		"1.":                             {0, false},
		".5G":                            {0, false},
		"1..5G":                          {0, false},
		"1e9":                            {0, false},
		"0x10":                           {0, false},
		"1 GiB":                          {0, false},
		"1GiBs":                          {0, false},
		"1.5":                            {0, false},
		"1.0000000001K":                  {0, false},
		"16EiB":                          {0, false},
		"18446744073709551616":           {0, false},
		"99999999999999999999999999999G": {0, false},
		"1Gb/s":                          {0, false},
	}
	for in, tt := range tests {
		t.Run(in, func(t *testing.T) {
			got, err := parseSize(in)
			if (err == nil) != tt.ok {
				t.Fatalf("parseSize(%q) = %d, %v; want ok=%v", in, got, err, tt.ok)
			}
			if got != tt.want {
				t.Errorf("parseSize(%q) = %d, want %d", in, got, tt.want)
			}
		})
	}
}

func TestHumanBytes(t *testing.T) {
	tests := map[string]struct {
		in   uint64
		want string
	}{
		"zero":                 {0, "0B"},
		"bytes":                {1023, "1023B"},
		"kib":                  {1024, "1KiB"},
		"fraction":             {1536 << 20, "1.5GiB"},
		"64gib":                {64 << 30, "64GiB"},
		"tib":                  {1 << 40, "1TiB"},
		"decimal":              {10e9, "9.3GiB"},
		"max":                  {1<<64 - 1, "16EiB"},
		"whole from ten units": {31 << 29, "16GiB"}, // 15.5GiB: humanize.IBytes rounds at 10 units and above
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := humanBytes(tt.in); got != tt.want {
				t.Errorf("humanBytes(%d) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// FuzzParseSize checks that parseSize never panics and that what it
// accepts round-trips through plain digits.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1", "512MiB", "10G", "1.5GiB", "18446744073709551615", "1e9", ".5", "16EiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err != nil {
			return
		}
		m, err := parseSize(strconv.FormatUint(n, 10))
		if err != nil || m != n {
			t.Fatalf("parseSize(%q) = %d, but its digits parse to %d, %v", s, n, m, err)
		}
	})
}
