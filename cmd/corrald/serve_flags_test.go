package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestServeEnumsAtLoad: a setting with a fixed set of values is checked
// when corrald reads its configuration, whatever else is on or off, and
// the error names the setting and what it takes. With the real serve, the
// data directory is left untouched (no store opened, no admin.conf).
func TestServeEnumsAtLoad(t *testing.T) {
	for _, tc := range []struct {
		file    string
		setting string
		allowed string
	}{
		{"dhcp-mode: fulll\n", "dhcp-mode", "full, proxy, off"},
		{"dhcp-mode: fulll\nboot-interface: lo\nallow-test-images: true\n", "dhcp-mode", "full, proxy, off"},
		{"store: etc\n", "store", "bolt, etcd"},
		{"log-level: loud\n", "log-level", "debug, info, warn, error"},
		{"log-format: xml\n", "log-format", "text, json"},
		{"bmc-providers: [native-ipmi, redfish]\n", "bmc-providers", "native-ipmi, ipmitool, gofish"},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			path := writeConfig(t, tc.file)
			var out, errOut bytes.Buffer
			root := newRootCmd(&out, &errOut, runServer)
			root.SetArgs([]string{"serve", "--config", path, "--data-dir", dataDir, "--api-listen", "127.0.0.1:0",
				"--http-listen", "127.0.0.1:0", "--tftp-listen", "off", "--metrics-listen", "", "--no-ra"})
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // a serve that started anyway stops at once
			err := root.ExecuteContext(ctx)
			if err == nil {
				t.Fatalf("%q accepted", tc.file)
			}
			for _, want := range []string{tc.setting, tc.allowed} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
				ents, _ := os.ReadDir(dataDir)
				t.Errorf("data directory touched (%v): %d entries", err, len(ents))
			}
		})
	}
}

// TestServeRefusesTestImages: network boot with no discovery image built
// or given refuses to start, naming corrald images build, unless the test
// or lab opts in with --allow-test-images; network boot off, or images
// given, start as before.
func TestServeRefusesTestImages(t *testing.T) {
	dataDir := t.TempDir()
	_, err := serveWith(t, "serve", "--data-dir", dataDir, "--boot-interface", "lo")
	if err == nil || !strings.Contains(err.Error(), `corrald images build --data-dir `+dataDir) || !strings.Contains(err.Error(), "--allow-test-images") {
		t.Fatalf("boot with stand-ins: %v", err)
	}
	t.Setenv("CORRAL_BOOT_KERNEL", "/srv/vmlinuz") // a kernel alone: the initramfs would be the stand-in
	if _, err := serveWith(t, "serve", "--data-dir", dataDir, "--boot-interface", "lo"); err == nil {
		t.Fatal("a given kernel with the stand-in initramfs accepted")
	}
	if _, err := serveWith(t, "serve", "--data-dir", dataDir, "--boot-interface", "lo", "--boot-initrd", "/srv/initrd.img"); err != nil {
		t.Fatalf("images given: %v", err)
	}
	if _, err := serveWith(t, "serve", "--data-dir", dataDir, "--boot-interface", "lo", "--allow-test-images"); err != nil {
		t.Fatalf("--allow-test-images: %v", err)
	}
	t.Setenv("CORRAL_BOOT_KERNEL", "")
	if _, err := serveWith(t, "serve", "--data-dir", dataDir); err != nil {
		t.Fatalf("network boot off: %v", err)
	}
}

// TestServeHelp: `corrald serve --help` shows its flags in titled groups,
// each flag once, and no usage string's backquotes turned into a value
// name.
func TestServeHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut, runServer)
	root.SetArgs([]string{"serve", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	last := -1
	for _, title := range []string{groupGeneral, groupAPI, groupBoot, groupDHCP, groupMachines, groupFleet, groupLimits, groupObservability, "Global flags"} {
		i := strings.Index(help, "\n"+title+":\n")
		if i < 0 || i < last {
			t.Errorf("group %q missing or out of order", title)
		}
		last = i
	}
	for _, want := range []string{"--boot-kernel string ", "--dhcp-mode string ", "--api-listen string ", "--etcd-endpoints strings ", "--grpc-max-conns int ", "--metrics-listen string ", "--data-dir string ", "-h, --help "} {
		if strings.Count(help, want) != 1 {
			t.Errorf("%q shown %d times, want once", want, strings.Count(help, want))
		}
	}
	if m := regexp.MustCompile(`--[a-z-]+ corrald `).FindString(help); m != "" {
		t.Errorf("a backquoted command taken as a value name: %q", m)
	}
	// Every flag of serve is in the help, under some group.
	n := 0
	serve, _, _ := root.Find([]string{"serve"})
	serve.Flags().VisitAll(func(f *pflag.Flag) {
		n++
		if !strings.Contains(help, "--"+f.Name+" ") && !strings.Contains(help, "--"+f.Name+"\n") {
			t.Errorf("--%s not in the help", f.Name)
		}
	})
	if n < 100 {
		t.Errorf("%d flags, want the ~100 of serve", n)
	}
}
