package cloudinit

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

var seeds = map[string]Seed{
	"full": {
		InstanceID: "vm1-3f2a",
		Hostname:   "vm1.lab.example",
		User:       "corral",
		SSHKeys:    []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForGoldenTests corral@test"},
		NICs: []NIC{{
			MAC:         "52:54:00:12:34:56",
			Addresses:   []netip.Prefix{netip.MustParsePrefix("10.20.0.5/24"), netip.MustParsePrefix("fd00:20::5/64")},
			Gateway4:    netip.MustParseAddr("10.20.0.1"),
			Gateway6:    netip.MustParseAddr("fd00:20::1"),
			Nameservers: []netip.Addr{netip.MustParseAddr("10.20.0.1"), netip.MustParseAddr("9.9.9.9")},
			Search:      []string{"lab.example"},
		}, {
			MAC:       "52:54:00:AB:CD:EF",
			Addresses: []netip.Prefix{netip.MustParsePrefix("192.168.7.9/24")},
		}},
	},
	"minimal": {InstanceID: "i-1", Hostname: "tiny", NICs: []NIC{{MAC: "52:54:00:00:00:01"}}},
}

func TestGolden(t *testing.T) {
	for name, s := range seeds {
		t.Run(name, func(t *testing.T) {
			files, err := s.Files()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{MetaData, UserData, NetworkConfig} {
				path := filepath.Join("testdata", name+"."+f+".golden")
				if *update {
					os.MkdirAll("testdata", 0o755)
					if err := os.WriteFile(path, files[f], 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update)", err)
				}
				if d := cmp.Diff(string(want), string(files[f])); d != "" {
					t.Errorf("%s (-golden +got):\n%s", f, d)
				}
			}
		})
	}
}

// TestISORoundTrip reads the ISO back with the same library a guest-side
// reader would use: label cidata, the three files byte for byte.
func TestISORoundTrip(t *testing.T) {
	s := seeds["full"]
	var buf bytes.Buffer
	if err := s.WriteISO(&buf); err != nil {
		t.Fatal(err)
	}
	label, got, err := ReadISO(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if label != Label {
		t.Errorf("label %q, want %q", label, Label)
	}
	want, _ := s.Files()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("files (-want +got):\n%s", d)
	}
}

func TestValidate(t *testing.T) {
	good := seeds["full"]
	bad := map[string]func(*Seed){
		"no instance id":  func(s *Seed) { s.InstanceID = "" },
		"hostname space":  func(s *Seed) { s.Hostname = "a b" },
		"hostname dash":   func(s *Seed) { s.Hostname = "-x" },
		"user injection":  func(s *Seed) { s.User = "root\nsudo: x" },
		"key newline":     func(s *Seed) { s.SSHKeys = []string{"ssh-rsa AAA\nruncmd"} },
		"bad mac":         func(s *Seed) { s.NICs = []NIC{{MAC: "zz"}} },
		"duplicate mac":   func(s *Seed) { s.NICs = []NIC{{MAC: "52:54:00:00:00:01"}, {MAC: "52:54:00:00:00:01"}} },
		"v6 gw4":          func(s *Seed) { s.NICs = []NIC{{MAC: "52:54:00:00:00:01", Gateway4: netip.MustParseAddr("fd00::1")}} },
		"search injected": func(s *Seed) { s.NICs = []NIC{{MAC: "52:54:00:00:00:01", Search: []string{"a\nb"}}} },
	}
	for name, mut := range bad {
		t.Run(name, func(t *testing.T) {
			s := good
			s.NICs = append([]NIC(nil), good.NICs...)
			mut(&s)
			if _, err := s.Files(); !errors.Is(err, apierr.ErrInvalid) {
				t.Errorf("Files: %v, want apierr.ErrInvalid", err)
			}
		})
	}
}

func BenchmarkWriteISO(b *testing.B) {
	s := seeds["full"]
	for b.Loop() {
		var buf bytes.Buffer
		if err := s.WriteISO(&buf); err != nil {
			b.Fatal(err)
		}
	}
}
