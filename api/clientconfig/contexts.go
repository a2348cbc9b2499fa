package clientconfig

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// DefaultContext names the connection held by a file's top-level endpoint,
// ca_cert and token keys.
const DefaultContext = "default"

// MaxContexts bounds the contexts one file may hold.
const MaxContexts = 256

// File is a client configuration file with named contexts. Its top-level
// endpoint, ca_cert and token (the embedded Config) are the context named
// "default", so every file Config.Write produced is a File with one
// context. A file may add:
//
//	current_context: site-b
//	contexts:
//	- name: site-b
//	  endpoint: 10.1.0.2:20180
//	  ca_cert: |
//	    -----BEGIN CERTIFICATE-----
//	    ...
//	  token: ...
//
// The top-level keys may then be left empty. current_context, when set,
// names the context Load and Context("") return; otherwise that is
// "default".
type File struct {
	Config
	CurrentContext string         `json:"current_context,omitempty"`
	Contexts       []NamedContext `json:"contexts,omitempty"`
}

// NamedContext is one entry of a File's contexts.
type NamedContext struct {
	Name string `json:"name"`
	Config
}

// ContextInfo describes one context without its secret, for listings.
type ContextInfo struct {
	Name     string
	Endpoint string
	HasCA    bool
	HasToken bool
	Current  bool
}

// LoadFile reads and strictly parses the configuration file at path, with
// every context. It returns an error naming path when the file cannot be
// read or parsed, has unknown or duplicate keys, or fails the checks of
// Validate.
func LoadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("clientconfig: %w", err)
	}
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("clientconfig: parse %s: %w", path, err)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("clientconfig: %s: %w", path, err)
	}
	return &f, nil
}

// Write stores f at path like Config.Write (YAML, mode 0600, atomic
// replace, the directory must exist). A File with no named contexts and
// no current_context is written with exactly Config.Write's keys. It
// returns an error naming path if f fails Validate or a filesystem step
// fails; on error path is left untouched.
func (f *File) Write(path string) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("clientconfig: %s: %w", path, err)
	}
	data, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("clientconfig: encode %s: %w", path, err)
	}
	return writeAtomic(path, data)
}

// hasDefault reports whether the top-level keys hold a context.
func (f *File) hasDefault() bool {
	return strings.TrimSpace(f.Endpoint) != ""
}

// Validate checks f: the top-level connection (when it has an endpoint)
// and every context pass Config's checks; context names are non-empty,
// without whitespace, unique and not "default"; there is at least one
// context; current_context names one of them; at most MaxContexts.
func (f *File) Validate() error {
	if f == nil {
		return errors.New("nil config")
	}
	if f.hasDefault() {
		if err := f.Config.validate(); err != nil {
			return err
		}
	} else if f.CACert != "" || f.Token != "" {
		return errors.New("endpoint is required")
	}
	if len(f.Contexts) > MaxContexts {
		return fmt.Errorf("%d contexts, at most %d", len(f.Contexts), MaxContexts)
	}
	seen := map[string]bool{}
	for i := range f.Contexts {
		c := &f.Contexts[i]
		if err := checkContextName(c.Name); err != nil {
			return fmt.Errorf("contexts[%d]: %w", i, err)
		}
		if seen[c.Name] {
			return fmt.Errorf("context %q is defined twice", c.Name)
		}
		seen[c.Name] = true
		if err := c.Config.validate(); err != nil {
			return fmt.Errorf("context %q: %w", c.Name, err)
		}
	}
	if !f.hasDefault() && len(f.Contexts) == 0 {
		return errors.New("endpoint is required")
	}
	if f.CurrentContext != "" {
		if _, err := f.Context(f.CurrentContext); err != nil {
			return fmt.Errorf("current_context: %w", err)
		}
	}
	return nil
}

// checkContextName refuses names that could not be typed or listed
// plainly, and the reserved DefaultContext.
func checkContextName(name string) error {
	switch {
	case name == "":
		return errors.New("context name is empty")
	case name == DefaultContext:
		return fmt.Errorf("context name %q is reserved for the top-level endpoint, ca_cert and token", DefaultContext)
	case len(name) > 253:
		return fmt.Errorf("context name %.20q... is longer than 253 bytes", name)
	case strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return fmt.Errorf("context name %q contains whitespace or control characters", name)
	}
	return nil
}

// Names returns the names of f's contexts: "default" first when the
// top-level keys hold one, then the named contexts in file order.
func (f *File) Names() []string {
	var names []string
	if f.hasDefault() {
		names = append(names, DefaultContext)
	}
	for _, c := range f.Contexts {
		names = append(names, c.Name)
	}
	return names
}

// Current returns the name of the context Context("") selects: the
// current_context, else "default" when the top-level keys hold one, else
// the only named context; "" when there is no way to choose.
func (f *File) Current() string {
	switch {
	case f.CurrentContext != "":
		return f.CurrentContext
	case f.hasDefault():
		return DefaultContext
	case len(f.Contexts) == 1:
		return f.Contexts[0].Name
	}
	return ""
}

// Context returns a copy of the connection of the context named name, or
// of the current one (Current) when name is empty. An unknown name is an
// error naming the known ones.
func (f *File) Context(name string) (*Config, error) {
	if name == "" {
		name = f.Current()
		if name == "" {
			return nil, fmt.Errorf("no current context among %s: choose one (corral config use-context NAME or --context NAME)", quoteList(f.Names()))
		}
	}
	if name == DefaultContext && f.hasDefault() {
		c := f.Config
		return &c, nil
	}
	for _, nc := range f.Contexts {
		if nc.Name == name {
			c := nc.Config
			return &c, nil
		}
	}
	return nil, fmt.Errorf("unknown context %q (known: %s)", name, quoteList(f.Names()))
}

// SetContext creates or replaces the context named name with c: name
// "default" sets the top-level keys. It validates c and the name and
// returns an error without changing f when either is refused.
func (f *File) SetContext(name string, c Config) error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("context %q: %w", name, err)
	}
	if name == DefaultContext {
		f.Config = c
		return nil
	}
	if err := checkContextName(name); err != nil {
		return err
	}
	for i := range f.Contexts {
		if f.Contexts[i].Name == name {
			f.Contexts[i].Config = c
			return nil
		}
	}
	if len(f.Contexts) >= MaxContexts {
		return fmt.Errorf("the file already holds %d contexts, at most %d", len(f.Contexts), MaxContexts)
	}
	f.Contexts = append(f.Contexts, NamedContext{Name: name, Config: c})
	return nil
}

// UseContext makes name the current context; an unknown name is an error
// naming the known ones and leaves f unchanged.
func (f *File) UseContext(name string) error {
	if _, err := f.Context(name); err != nil {
		return err
	}
	f.CurrentContext = name
	return nil
}

// List describes every context, never its token or CA text.
func (f *File) List() []ContextInfo {
	cur := f.Current()
	var out []ContextInfo
	for _, name := range f.Names() {
		c, _ := f.Context(name)
		out = append(out, ContextInfo{
			Name: name, Endpoint: c.Endpoint,
			HasCA: c.CACert != "", HasToken: c.Token != "",
			Current: name == cur,
		})
	}
	return out
}

func quoteList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	q := slices.Clone(names)
	for i, n := range q {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
