package flagconf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

// values are the flags of testSet after Apply.
type values struct {
	Mode     string
	Count    int
	Wait     time.Duration
	On       bool
	DNS      []string // stringSlice
	Selector []string // stringArray
	Name     string
}

// testSet declares one flag of each kind a binary uses, plus --config.
func testSet(v *values) *pflag.FlagSet {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.String("config", "", "YAML file")
	fs.StringVar(&v.Mode, "dhcp-mode", "proxy", "")
	fs.IntVar(&v.Count, "poll-concurrency", 16, "")
	fs.DurationVar(&v.Wait, "boot-watchdog", time.Minute, "")
	fs.BoolVar(&v.On, "no-ra", false, "")
	fs.StringSliceVar(&v.DNS, "dhcp-dns", nil, "")
	fs.StringArrayVar(&v.Selector, "auto-accept-selector", nil, "")
	fs.StringVar(&v.Name, "name", "host", "")
	return fs
}

// apply parses args, writes file (if any) and runs Apply with env.
func apply(t *testing.T, args []string, env []string, file string) (values, *pflag.FlagSet, error) {
	t.Helper()
	var v values
	fs := testSet(&v)
	if file != "" {
		path := filepath.Join(t.TempDir(), "corrald.yaml")
		if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	err := Apply(fs, Options{
		FileFlag: "config",
		Aliases:  map[string][]string{"name": {"CORRAL_NODE_NAME"}},
		Environ:  func() []string { return env },
	})
	return v, fs, err
}

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{
		"boot-interface":       "CORRAL_BOOT_INTERFACE",
		"dir":                  "CORRAL_DIR",
		"auto-accept-selector": "CORRAL_AUTO_ACCEPT_SELECTOR",
	} {
		if got := EnvName(flag); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", flag, got, want)
		}
	}
}

// TestPrecedence: command line > environment > file > default, flag by
// flag, for every kind of flag.
func TestPrecedence(t *testing.T) {
	const file = `
dhcp-mode: full
poll-concurrency: 4
boot-watchdog: 90s
no-ra: true
dhcp-dns: [10.0.0.1, 10.0.0.2]
auto-accept-selector: ["disk.count>=2", "cpu.cores>=4"]
name: from-file
`
	def := values{Mode: "proxy", Count: 16, Wait: time.Minute, Name: "host"}
	for name, tc := range map[string]struct {
		args []string
		env  []string
		file string
		want values
	}{
		"default": {want: def},
		"file over default": {file: file, want: values{
			Mode: "full", Count: 4, Wait: 90 * time.Second, On: true,
			DNS: []string{"10.0.0.1", "10.0.0.2"}, Selector: []string{"disk.count>=2", "cpu.cores>=4"}, Name: "from-file",
		}},
		"env over file": {
			file: file,
			env: []string{"CORRAL_DHCP_MODE=off", "CORRAL_POLL_CONCURRENCY=2", "CORRAL_BOOT_WATCHDOG=-1s", "CORRAL_NO_RA=false",
				"CORRAL_DHCP_DNS=1.1.1.1, 8.8.8.8", "CORRAL_AUTO_ACCEPT_SELECTOR=mem.gib>=8", "CORRAL_NAME=from-env"},
			want: values{Mode: "off", Count: 2, Wait: -time.Second, On: false,
				DNS: []string{"1.1.1.1", "8.8.8.8"}, Selector: []string{"mem.gib>=8"}, Name: "from-env"},
		},
		"flag over env and file": {
			args: []string{"--dhcp-mode", "proxy", "--poll-concurrency=1", "--boot-watchdog", "5m", "--no-ra",
				"--dhcp-dns", "9.9.9.9", "--auto-accept-selector", "a", "--auto-accept-selector", "b", "--name", "from-flag"},
			file: file,
			env:  []string{"CORRAL_DHCP_MODE=off", "CORRAL_POLL_CONCURRENCY=2", "CORRAL_NO_RA=false", "CORRAL_DHCP_DNS=1.1.1.1", "CORRAL_NAME=from-env"},
			want: values{Mode: "proxy", Count: 1, Wait: 5 * time.Minute, On: true,
				DNS: []string{"9.9.9.9"}, Selector: []string{"a", "b"}, Name: "from-flag"},
		},
		"mixed sources per flag": {
			args: []string{"--dhcp-mode=full"},
			env:  []string{"CORRAL_POLL_CONCURRENCY=3"},
			file: "boot-watchdog: 2m\npoll-concurrency: 9\n",
			want: values{Mode: "full", Count: 3, Wait: 2 * time.Minute, Name: "host"},
		},
		"empty env is unset": {
			env:  []string{"CORRAL_DHCP_MODE=", "CORRAL_NAME="},
			file: "dhcp-mode: full\n",
			want: values{Mode: "full", Count: 16, Wait: time.Minute, Name: "host"},
		},
		"alias": {
			env:  []string{"CORRAL_NODE_NAME=old-name"},
			want: values{Mode: "proxy", Count: 16, Wait: time.Minute, Name: "old-name"},
		},
		"rule name over alias": {
			env:  []string{"CORRAL_NODE_NAME=old-name", "CORRAL_NAME=new-name"},
			want: values{Mode: "proxy", Count: 16, Wait: time.Minute, Name: "new-name"},
		},
		"unrelated variables ignored": {
			env:  []string{"CORRAL_TEST_LOG=1", "CORRAL_KEEP_LAB=1", "PATH=/bin", "DHCP_MODE=full"},
			want: def,
		},
		"file flag not from env": {
			env:  []string{"CORRAL_CONFIG=" + writeFile(t, "dhcp-mode: full\n")},
			want: def,
		},
		"empty file": {file: "# nothing set\n", want: def},
	} {
		t.Run(name, func(t *testing.T) {
			got, _, err := apply(t, tc.args, tc.env, tc.file)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("values (-want +got):\n%s", diff)
			}
		})
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "from-env.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestListValues: YAML lists replace the default; a scalar means what it
// means on the command line (comma-separated for a stringSlice, one
// item for a stringArray); null empties the list.
func TestListValues(t *testing.T) {
	for name, tc := range map[string]struct {
		file         string
		env          []string
		wantDNS      []string
		wantSelector []string
	}{
		"yaml lists":         {file: "dhcp-dns:\n  - 10.0.0.1\n  - 10.0.0.2\nauto-accept-selector: [\"a,b\"]\n", wantDNS: []string{"10.0.0.1", "10.0.0.2"}, wantSelector: []string{"a,b"}},
		"flow list":          {file: "dhcp-dns: [10.0.0.1]\n", wantDNS: []string{"10.0.0.1"}},
		"scalar slice":       {file: "dhcp-dns: 10.0.0.1,10.0.0.2\nauto-accept-selector: disk.count>=2\n", wantDNS: []string{"10.0.0.1", "10.0.0.2"}, wantSelector: []string{"disk.count>=2"}},
		"empty list":         {file: "dhcp-dns: []\n", wantDNS: []string{}},
		"null":               {file: "dhcp-dns:\n", wantDNS: nil},
		"env comma list":     {env: []string{"CORRAL_AUTO_ACCEPT_SELECTOR=a, b,,c"}, wantSelector: []string{"a", "b", "c"}},
		"numbers as strings": {file: "dhcp-dns: [1, 2.5, true]\n", wantDNS: []string{"1", "2.5", "true"}},
	} {
		t.Run(name, func(t *testing.T) {
			got, _, err := apply(t, nil, tc.env, tc.file)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if diff := cmp.Diff(tc.wantDNS, got.DNS); diff != "" {
				t.Errorf("dhcp-dns (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSelector, got.Selector); diff != "" {
				t.Errorf("auto-accept-selector (-want +got):\n%s", diff)
			}
		})
	}
}

// TestChanged: a flag set from the environment or the file reads as
// given (cobra's required-flag check and "explicit" logic rely on it);
// one left at its default does not.
func TestChanged(t *testing.T) {
	_, fs, err := apply(t, nil, []string{"CORRAL_DHCP_MODE=full", "CORRAL_DHCP_DNS=1.1.1.1"}, "boot-watchdog: 1m\nauto-accept-selector: [a]\n")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"dhcp-mode": true, "dhcp-dns": true, "boot-watchdog": true, "auto-accept-selector": true, "no-ra": false} {
		if got := fs.Changed(name); got != want {
			t.Errorf("Changed(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestUnknownKey: a key that is no flag is an error naming the key and
// the file.
func TestUnknownKey(t *testing.T) {
	for name, tc := range map[string]struct{ file, key string }{
		"typo":           {"dhcp-mod: full\n", "dhcp-mod"},
		"env style":      {"DHCP_MODE: full\n", "DHCP_MODE"},
		"the file flag":  {"config: /etc/other.yaml\n", "config"},
		"help":           {"help: true\n", "help"},
		"nested unknown": {"boot:\n  interface: br0\n", "boot.interface"},
	} {
		t.Run(name, func(t *testing.T) {
			_, fs, err := apply(t, nil, nil, tc.file)
			if !errors.Is(err, ErrUnknownKey) {
				t.Fatalf("Apply = %v, want ErrUnknownKey", err)
			}
			path, _ := fs.GetString("config")
			for _, want := range []string{path, `"` + tc.key + `"`} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
		})
	}
}

// TestBadValue: a value the flag cannot take is an error naming the key
// and the file (or the environment variable), and the type wanted.
func TestBadValue(t *testing.T) {
	for name, tc := range map[string]struct {
		args  []string
		file  string
		env   []string
		names []string // what the error must name besides the file
	}{
		"overridden by the flag": {args: []string{"--poll-concurrency=3"}, file: "poll-concurrency: lots\n", names: []string{`"poll-concurrency"`, "want int"}},
		"overridden by env":      {env: []string{"CORRAL_BOOT_WATCHDOG=1m"}, file: "boot-watchdog: soon\n", names: []string{`"boot-watchdog"`, "want duration"}},
		"string for int":         {file: "poll-concurrency: lots\n", names: []string{`"poll-concurrency"`, "want int"}},
		"float for int":          {file: "poll-concurrency: 1.5\n", names: []string{`"poll-concurrency"`, "want int"}},
		"word for bool":          {file: "no-ra: maybe\n", names: []string{`"no-ra"`, "want bool"}},
		"bad duration":           {file: "boot-watchdog: 90\n", names: []string{`"boot-watchdog"`, "want duration"}},
		"list for string":        {file: "dhcp-mode: [full, proxy]\n", names: []string{`"dhcp-mode"`, "want string", "got a list"}},
		"map for string":         {file: "dhcp-mode:\n  kind: full\n", names: []string{`"dhcp-mode"`, "got a map"}},
		"empty map":              {file: "dhcp-mode: {}\n", names: []string{`"dhcp-mode"`, "want string"}},
		"map in list":            {file: "dhcp-dns:\n  - a: 1\n", names: []string{`"dhcp-dns"`, "item 0"}},
		"null for int":           {file: "poll-concurrency:\n", names: []string{`"poll-concurrency"`}},
		"env bad int":            {env: []string{"CORRAL_POLL_CONCURRENCY=lots"}, names: []string{"CORRAL_POLL_CONCURRENCY", "--poll-concurrency", "want int"}},
		"env bad alias value":    {env: []string{"CORRAL_NO_RA=maybe"}, names: []string{"CORRAL_NO_RA"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, fs, err := apply(t, tc.args, tc.env, tc.file)
			if !errors.Is(err, ErrBadValue) {
				t.Fatalf("Apply = %v, want ErrBadValue", err)
			}
			names := tc.names
			if tc.file != "" {
				path, _ := fs.GetString("config")
				names = append(names, path)
			}
			for _, want := range names {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
		})
	}
}

func TestFileErrors(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		var v values
		fs := testSet(&v)
		missing := filepath.Join(t.TempDir(), "absent.yaml")
		if err := fs.Parse([]string{"--config", missing}); err != nil {
			t.Fatal(err)
		}
		err := Apply(fs, Options{FileFlag: "config", Environ: func() []string { return nil }})
		if err == nil || !strings.Contains(err.Error(), missing) {
			t.Fatalf("Apply = %v, want an error naming %s", err, missing)
		}
	})
	t.Run("not yaml", func(t *testing.T) {
		_, fs, err := apply(t, nil, nil, "dhcp-mode: [unclosed\n")
		path, _ := fs.GetString("config")
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Apply = %v, want an error naming %s", err, path)
		}
	})
	t.Run("not a map", func(t *testing.T) {
		_, fs, err := apply(t, nil, nil, "- dhcp-mode\n")
		path, _ := fs.GetString("config")
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Apply = %v, want an error naming %s", err, path)
		}
	})
}

// TestNoFileFlag: without FileFlag nothing is read, even with a --config
// flag in the set (corral's --config is its client file, not ours), and
// that --config reads CORRAL_CONFIG like any flag.
func TestNoFileFlag(t *testing.T) {
	var v values
	fs := testSet(&v)
	if err := fs.Parse([]string{"--config", filepath.Join(t.TempDir(), "absent.yaml")}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, Options{Environ: func() []string { return []string{"CORRAL_DHCP_MODE=full"} }}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if v.Mode != "full" {
		t.Errorf("dhcp-mode = %q, want full", v.Mode)
	}
	fs = testSet(&v)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, Options{Environ: func() []string { return []string{"CORRAL_CONFIG=/client.yaml"} }}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if got, _ := fs.GetString("config"); got != "/client.yaml" {
		t.Errorf("config = %q, want /client.yaml from CORRAL_CONFIG", got)
	}
}
