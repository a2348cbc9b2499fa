// Package flagconf is the one configuration mechanism of Corral's
// binaries (corrald, corral, corral-node, corral-lab): each binary
// declares pflag flags, and Apply gives every flag two more sources, an
// environment variable and, where the binary offers one, a YAML file
// whose keys are the flag names.
//
// Precedence is command line > environment > file > the flag's default.
// The environment variable of flag "boot-interface" is
// CORRAL_BOOT_INTERFACE (EnvName); names that predate that rule are kept
// as explicit aliases (Options.Aliases). Values from the environment and
// the file go through the flag's own parser, so they mean what they mean
// on the command line; list flags take a YAML list, or comma-separated
// text (the environment, a YAML string). The flag naming the file is read
// from the command line only.
//
// The file and the environment are read with koanf. The package imports
// nothing of Corral's and must not: every binary links it, corral-node
// inside the size-bounded discovery initramfs.
package flagconf

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
)

// Prefix starts the environment variable of every flag.
const Prefix = "CORRAL_"

// Errors of the configuration file, wrapped with the file and the key.
var (
	// ErrUnknownKey: the file names a key that is no flag.
	ErrUnknownKey = errors.New("unknown key")
	// ErrBadValue: a value (from the file or the environment) that the
	// flag cannot take.
	ErrBadValue = errors.New("bad value")
)

// EnvName returns the environment variable of the flag name: Prefix
// followed by the name in upper case with '-' turned into '_'.
func EnvName(flag string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Options says where Apply looks besides the command line.
type Options struct {
	// FileFlag names the flag (e.g. "config") whose value is the YAML
	// file to read; "" or a flag the set lacks reads no file. That flag
	// is taken from the command line only: neither the environment
	// (CORRAL_CONFIG is the corral CLI's client file, often exported in
	// the shells corrald and corral-lab start from) nor the file sets it.
	FileFlag string
	// Aliases maps a flag name to further environment variables for it,
	// read in order when EnvName(flag) is unset: names that predate the
	// rule (CORRAL_NODE_NAME for corral-node --name).
	Aliases map[string][]string
	// Environ returns the environment as KEY=VALUE strings; nil means
	// os.Environ.
	Environ func() []string
}

// Apply sets each flag of fs that the command line did not set: from its
// environment variable (an empty value counts as unset), else from the
// file named on the command line by the FileFlag. Call it after fs is
// parsed. A flag Apply sets is marked Changed, as if it had been given.
// The "help" flag is left alone. Every key of the file is checked, also
// one whose flag the command line or the environment sets.
//
// Apply reads that file and the environment. Its errors name the
// environment variable, or the file and the key; a key that is no flag
// wraps ErrUnknownKey, a value the flag cannot take ErrBadValue. It is
// not safe for concurrent use with other users of fs.
func Apply(fs *pflag.FlagSet, o Options) error {
	var flags []*pflag.Flag
	fromCmdline := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		flags = append(flags, f)
		fromCmdline[f.Name] = f.Changed
	})

	environ, err := loadEnv(flags, o)
	if err != nil {
		return err
	}
	fromEnv := map[string]bool{}
	for _, f := range flags {
		if fromCmdline[f.Name] || f.Name == o.FileFlag {
			continue
		}
		for _, name := range append([]string{EnvName(f.Name)}, o.Aliases[f.Name]...) {
			if !environ.Exists(name) {
				continue
			}
			v := environ.String(name)
			if err := set(fs, f, v, splitList(v)); err != nil {
				return fmt.Errorf("%s=%q (--%s): %w: want %s: %v", name, v, f.Name, ErrBadValue, f.Value.Type(), err)
			}
			fromEnv[f.Name] = true
			break
		}
	}

	ff := fs.Lookup(o.FileFlag)
	if o.FileFlag == "" || ff == nil || ff.Value.String() == "" {
		return nil
	}
	path := ff.Value.String()
	k := koanf.New(".")
	if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	for _, key := range k.Keys() {
		f := fs.Lookup(key)
		if f == nil || f.Name == "help" || f.Name == o.FileFlag {
			// koanf flattens a nested map into "flag.sub": under a flag
			// name that is a value of the wrong type, not a stray key.
			if parent, _, ok := strings.Cut(key, "."); ok && fs.Lookup(parent) != nil && parent != "help" && parent != o.FileFlag {
				pf := fs.Lookup(parent)
				return fmt.Errorf("config file %s: key %q: %w: want %s: got a map", path, parent, ErrBadValue, pf.Value.Type())
			}
			return fmt.Errorf("config file %s: %w %q (keys are the flag names)", path, ErrUnknownKey, key)
		}
		v, items, err := fileValue(f, k.Get(key))
		switch {
		case err != nil:
		case fromCmdline[f.Name] || fromEnv[f.Name]:
			err = check(f, v)
		default:
			err = set(fs, f, v, items)
		}
		if err != nil {
			return fmt.Errorf("config file %s: key %q: %w: want %s: %v", path, key, ErrBadValue, f.Value.Type(), err)
		}
	}
	return nil
}

// loadEnv reads the environment variables of flags (by the rule and the
// aliases) with koanf's env provider; other variables are dropped, and
// so are empty values.
func loadEnv(flags []*pflag.Flag, o Options) (*koanf.Koanf, error) {
	known := map[string]bool{}
	for _, f := range flags {
		if f.Name == o.FileFlag {
			continue
		}
		known[EnvName(f.Name)] = true
		for _, a := range o.Aliases[f.Name] {
			known[a] = true
		}
	}
	k := koanf.New(".")
	err := k.Load(env.Provider("", env.Opt{
		EnvironFunc: o.Environ,
		TransformFunc: func(name, v string) (string, any) {
			if !known[name] || v == "" {
				return "", nil
			}
			return name, v
		},
	}), nil)
	if err != nil {
		return nil, fmt.Errorf("environment: %w", err)
	}
	return k, nil
}

// splitList is a list flag's text (an environment value, a YAML scalar)
// as items: comma-separated, trimmed, empty items dropped.
func splitList(v string) []string {
	var items []string
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			items = append(items, part)
		}
	}
	return items
}

// set gives f the scalar v, or, for a list flag, the items.
func set(fs *pflag.FlagSet, f *pflag.Flag, v string, items []string) error {
	sv, ok := f.Value.(pflag.SliceValue)
	if !ok {
		return fs.Set(f.Name, v)
	}
	if err := sv.Replace(items); err != nil {
		return err
	}
	// Replace does not mark the flag; Set would have.
	f.Changed = true
	return nil
}

// fileValue converts a value decoded from YAML for f: a scalar as
// command-line text v, or for a list flag the items of a YAML list or of a
// comma-separated scalar (null: no items).
func fileValue(f *pflag.Flag, y any) (v string, items []string, err error) {
	_, isList := f.Value.(pflag.SliceValue)
	switch y := y.(type) {
	case []any:
		if !isList {
			return "", nil, errors.New("got a list")
		}
		items = make([]string, 0, len(y))
		for i, item := range y {
			s, ok := scalar(item)
			if !ok {
				return "", nil, fmt.Errorf("item %d: got %T", i, item)
			}
			items = append(items, s)
		}
		return "", items, nil
	case nil:
		return "", nil, nil
	}
	v, ok := scalar(y)
	if !ok {
		return "", nil, fmt.Errorf("got %T", y)
	}
	if isList {
		return v, splitList(v), nil
	}
	return v, nil, nil
}

// parsers check text for a flag type as pflag's own Set parses it,
// without setting anything. Text for other types (string, the string
// lists) is always taken.
var parsers = map[string]func(string) error{
	"bool":     func(s string) error { _, err := strconv.ParseBool(s); return err },
	"int":      func(s string) error { _, err := strconv.ParseInt(s, 0, strconv.IntSize); return err },
	"int64":    func(s string) error { _, err := strconv.ParseInt(s, 0, 64); return err },
	"uint":     func(s string) error { _, err := strconv.ParseUint(s, 0, strconv.IntSize); return err },
	"uint64":   func(s string) error { _, err := strconv.ParseUint(s, 0, 64); return err },
	"float64":  func(s string) error { _, err := strconv.ParseFloat(s, 64); return err },
	"duration": func(s string) error { _, err := time.ParseDuration(s); return err },
}

// check reports whether a file value that the command line or the
// environment overrides could have been set: a file that would fail
// without the override fails with it.
func check(f *pflag.Flag, v string) error {
	if _, isList := f.Value.(pflag.SliceValue); isList {
		return nil
	}
	if parse, ok := parsers[f.Value.Type()]; ok {
		return parse(v)
	}
	return nil
}

// scalar formats a YAML scalar as command-line text.
func scalar(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case bool:
		return strconv.FormatBool(v), true
	case int, int64, uint64:
		return fmt.Sprint(v), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	}
	return "", false
}
