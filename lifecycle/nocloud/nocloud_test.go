package nocloud

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite golden files")

const (
	keyA = `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICwrqwawlljvSMxBquBmuH0i7zNDtQGcxWC7A33IdpRy ops@corral: "prod" #1`
	keyB = `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICwrqwawlljvSMxBquBmuH0i7zNDtQGcxWC7A33IdpRy`
)

var seeds = map[string]Seed{
	"full": {
		InstanceID:   "deploy-7f3a9c",
		Hostname:     "db1.rack.example",
		SSHKeys:      []string{keyA, keyB},
		UserData:     []byte("#cloud-config\npackages: [postgresql]\nruncmd:\n  - echo 'hello: world' # not a comment in YAML terms\n"),
		MAC:          "52:54:00:AB:CD:EF",
		Address:      netip.MustParsePrefix("10.20.0.5/24"),
		Gateway:      netip.MustParseAddr("10.20.0.1"),
		DNS:          []netip.Addr{netip.MustParseAddr("10.20.0.1"), netip.MustParseAddr("9.9.9.9")},
		PhoneHomeURL: "http://10.20.0.2:8080/phone-home/dep-1/tok3n",
	},
	"minimal": {InstanceID: "i-1", Hostname: "tiny"},
	"dhcp":    {InstanceID: "i-2", Hostname: "tiny", MAC: "52:54:00:00:00:01", UserData: []byte("#!/bin/sh\necho hi\n")},
}

var names = []string{"meta-data", "user-data", "vendor-data", "network-config"}

func files(t *testing.T, s Seed) map[string][]byte {
	t.Helper()
	md, ud, vd, nc, err := s.Files()
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{"meta-data": md, "user-data": ud, "vendor-data": vd, "network-config": nc}
}

func TestGolden(t *testing.T) {
	for name, s := range seeds {
		t.Run(name, func(t *testing.T) {
			got := files(t, s)
			for _, f := range names {
				path := filepath.Join("testdata", name+"."+f+".golden")
				if *update {
					if err := os.MkdirAll("testdata", 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, got[f], 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update)", err)
				}
				if d := cmp.Diff(string(want), string(got[f])); d != "" {
					t.Errorf("%s (-golden +got):\n%s", f, d)
				}
			}
		})
	}
}

// TestRoundTrip parses the rendered YAML back: values holding ": ",
// quotes, "#" and (in user data, which is passed through) newlines come
// out as they went in.
func TestRoundTrip(t *testing.T) {
	s := Seed{
		InstanceID:   `id: "x" #y 'z' - [a] {b} & *c ! | > %`,
		Hostname:     "h-1.example",
		SSHKeys:      []string{keyA, keyB + ` a: b #c "d"`},
		UserData:     []byte("#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: |\n      a: b # c\n      \"quoted\"\n"),
		MAC:          "52:54:00:12:34:56",
		Address:      netip.MustParsePrefix("192.168.7.9/24"),
		Gateway:      netip.MustParseAddr("192.168.7.1"),
		PhoneHomeURL: "https://corral.example:8443/phone-home/d%3A1/t?x=a:%20b#frag",
	}
	got := files(t, s)

	var md struct {
		InstanceID    string   `json:"instance-id"`
		LocalHostname string   `json:"local-hostname"`
		PublicKeys    []string `json:"public-keys"`
	}
	if err := yaml.UnmarshalStrict(got["meta-data"], &md); err != nil {
		t.Fatalf("meta-data: %v\n%s", err, got["meta-data"])
	}
	if md.InstanceID != s.InstanceID || md.LocalHostname != s.Hostname || !cmp.Equal(md.PublicKeys, s.SSHKeys) {
		t.Errorf("meta-data round trip: %+v\n%s", md, got["meta-data"])
	}

	if string(got["user-data"]) != string(s.UserData) {
		t.Errorf("user-data changed:\n%s", got["user-data"])
	}
	var ud struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
	}
	if err := yaml.Unmarshal(got["user-data"], &ud); err != nil || len(ud.WriteFiles) != 1 || ud.WriteFiles[0].Content != "a: b # c\n\"quoted\"\n" {
		t.Errorf("user-data: %+v %v", ud, err)
	}

	vd := got["vendor-data"]
	if !strings.HasPrefix(string(vd), "#cloud-config\n") {
		t.Errorf("vendor-data does not start with #cloud-config:\n%s", vd)
	}
	var v map[string]map[string]any
	if err := yaml.Unmarshal(vd, &v); err != nil {
		t.Fatalf("vendor-data: %v", err)
	}
	want := map[string]map[string]any{"phone_home": {"url": s.PhoneHomeURL, "post": "all", "tries": float64(10)}}
	if d := cmp.Diff(want, v); d != "" {
		t.Errorf("vendor-data (-want +got):\n%s", d)
	}

	var nc struct {
		Version   int `json:"version"`
		Ethernets map[string]struct {
			Match     map[string]string   `json:"match"`
			DHCP4     bool                `json:"dhcp4"`
			DHCP6     bool                `json:"dhcp6"`
			Addresses []string            `json:"addresses"`
			Routes    []map[string]string `json:"routes"`
		} `json:"ethernets"`
	}
	if err := yaml.UnmarshalStrict(got["network-config"], &nc); err != nil {
		t.Fatalf("network-config: %v\n%s", err, got["network-config"])
	}
	e, ok := nc.Ethernets[Interface]
	if nc.Version != 2 || !ok || e.Match["macaddress"] != "52:54:00:12:34:56" || e.DHCP4 ||
		!cmp.Equal(e.Addresses, []string{"192.168.7.9/24"}) ||
		!cmp.Equal(e.Routes, []map[string]string{{"to": "0.0.0.0/0", "via": "192.168.7.1"}}) {
		t.Errorf("network-config: %+v\n%s", nc, got["network-config"])
	}
	if strings.Contains(string(got["network-config"]), "set-name") {
		t.Errorf("network-config renames the NIC:\n%s", got["network-config"])
	}
}

func TestEmptyUserData(t *testing.T) {
	got := files(t, seeds["minimal"])
	if string(got["user-data"]) != "#cloud-config\n{}\n" || string(got["vendor-data"]) != "#cloud-config\n{}\n" {
		t.Errorf("user-data %q vendor-data %q", got["user-data"], got["vendor-data"])
	}
	if got["network-config"] != nil {
		t.Errorf("network-config without a MAC: %q", got["network-config"])
	}
}

func TestRefusals(t *testing.T) {
	ok := seeds["full"]
	tests := map[string]struct {
		edit func(*Seed)
		want string
	}{
		"no instance id":        {func(s *Seed) { s.InstanceID = "" }, "instance id"},
		"instance id newline":   {func(s *Seed) { s.InstanceID = "a\nb" }, "instance id"},
		"hostname underscore":   {func(s *Seed) { s.Hostname = "db_1" }, "RFC 1123"},
		"hostname dash first":   {func(s *Seed) { s.Hostname = "-db" }, "RFC 1123"},
		"hostname label long":   {func(s *Seed) { s.Hostname = strings.Repeat("a", 64) }, "RFC 1123"},
		"hostname empty":        {func(s *Seed) { s.Hostname = "" }, "RFC 1123"},
		"hostname injection":    {func(s *Seed) { s.Hostname = "a\nruncmd: [x]" }, "RFC 1123"},
		"key two lines":         {func(s *Seed) { s.SSHKeys = []string{keyA + "\n" + keyB} }, "SSH key 1 is not one authorized_keys line"},
		"key garbage":           {func(s *Seed) { s.SSHKeys = []string{keyB, "ssh-rsa notbase64 x"} }, "SSH key 2"},
		"key empty":             {func(s *Seed) { s.SSHKeys = []string{""} }, "SSH key 1"},
		"user data too big":     {func(s *Seed) { s.UserData = make([]byte, MaxUserData+1) }, "user data is 65537 bytes"},
		"cloud-config not yaml": {func(s *Seed) { s.UserData = []byte("#cloud-config\nruncmd: [\n") }, "is not YAML"},
		"cloud-config a list":   {func(s *Seed) { s.UserData = []byte("#cloud-config\n- a\n") }, "not a YAML mapping"},
		"bad MAC":               {func(s *Seed) { s.MAC = "52:54:00" }, "MAC"},
		"address without MAC":   {func(s *Seed) { s.MAC = "" }, "without the NIC's MAC"},
		"gateway family":        {func(s *Seed) { s.Gateway = netip.MustParseAddr("fd00::1") }, "family"},
		"gateway no address":    {func(s *Seed) { s.Address = netip.Prefix{} }, "without an address"},
		"bad DNS":               {func(s *Seed) { s.DNS = []netip.Addr{{}} }, "DNS server"},
		"url newline":           {func(s *Seed) { s.PhoneHomeURL = "http://a/b\nc" }, "phone-home URL"},
		"url scheme":            {func(s *Seed) { s.PhoneHomeURL = "file:///etc/passwd" }, "phone-home URL"},
		"url relative":          {func(s *Seed) { s.PhoneHomeURL = "/phone-home/x" }, "phone-home URL"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := ok
			s.SSHKeys = append([]string(nil), ok.SSHKeys...)
			tc.edit(&s)
			_, _, _, _, err := s.Files()
			if !errors.Is(err, apierr.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}
