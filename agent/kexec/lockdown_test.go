package kexec

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLockdown(t *testing.T) {
	for in, want := range map[string]string{
		"[none] integrity confidentiality\n": "none",
		"none [integrity] confidentiality\n": "integrity",
		"none integrity [confidentiality]":   "confidentiality",
		"none integrity confidentiality":     "",
		"[evil] [":                           "",
		"":                                   "",
	} {
		if got := Lockdown([]byte(in)); got != want {
			t.Errorf("Lockdown(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAutoLoadUnderLockdown: a locked-down kernel loads with
// kexec_file_load only (kexec_load is refused under lockdown); an
// unlocked or unknown one tries kexec_load first.
func TestAutoLoadUnderLockdown(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		lockdown string // "" : no file
		want     string
	}{
		"integrity": {"none [integrity] confidentiality\n", "file"},
		"confid":    {"none integrity [confidentiality]\n", "file"},
		"none":      {"[none] integrity confidentiality\n", "segments"},
		"no fs":     {"", "segments"},
	} {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(dir, name)
			if tc.lockdown != "" {
				os.WriteFile(f, []byte(tc.lockdown), 0o644)
			}
			var called []string
			seg := func(*os.File, *os.File, string) error { called = append(called, "segments"); return nil }
			file := func(*os.File, *os.File, string) error { called = append(called, "file"); return nil }
			var console strings.Builder
			if err := autoLoad(nil, nil, "x", &console, slog.New(slog.DiscardHandler), f, seg, file); err != nil {
				t.Fatal(err)
			}
			if strings.Join(called, ",") != tc.want {
				t.Errorf("loaders called %v, want %s", called, tc.want)
			}
		})
	}
	// Under lockdown a refused kexec_file_load (an unsigned kernel) is
	// the error, with no kexec_load attempt.
	f := filepath.Join(dir, "locked")
	os.WriteFile(f, []byte("none [integrity] confidentiality"), 0o644)
	seg := func(*os.File, *os.File, string) error { t.Error("kexec_load tried under lockdown"); return nil }
	file := func(*os.File, *os.File, string) error { return errors.New("key was rejected by service") }
	err := autoLoad(nil, nil, "x", io.Discard, slog.New(slog.DiscardHandler), f, seg, file)
	if err == nil || !strings.Contains(err.Error(), "lockdown (integrity)") {
		t.Errorf("err = %v", err)
	}
}
