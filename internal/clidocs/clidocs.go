// Package clidocs writes the Markdown reference of a cobra command tree
// (docs/cli: one page per command, cobra/doc's layout) and compares a
// committed copy with the tree, so the reference cannot drift from the
// binaries. `make docs` writes it; each binary's test checks it.
//
// It imports nothing of Corral's.
package clidocs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// Generate returns the pages of root's tree: file name → content.
func Generate(root *cobra.Command) (map[string][]byte, error) {
	root.DisableAutoGenTag = true // no date: the pages are committed
	pages := map[string][]byte{}
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		if !c.IsAvailableCommand() && c != root || c.IsAdditionalHelpTopicCommand() {
			return nil
		}
		c.DisableAutoGenTag = true
		var b bytes.Buffer
		if err := doc.GenMarkdownCustom(c, &b, func(s string) string { return s }); err != nil {
			return fmt.Errorf("%s: %w", c.CommandPath(), err)
		}
		pages[strings.ReplaceAll(c.CommandPath(), " ", "_")+".md"] = b.Bytes()
		for _, sub := range c.Commands() {
			if err := walk(sub); err != nil {
				return err
			}
		}
		return nil
	}
	return pages, walk(root)
}

// Write writes the pages of root's tree into dir, removing pages of the
// tree's commands that no longer exist.
func Write(root *cobra.Command, dir string) error {
	pages, err := Generate(root)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stale, err := owned(root, dir)
	if err != nil {
		return err
	}
	for _, name := range stale {
		if _, ok := pages[name]; !ok {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	for name, b := range pages {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Diff compares dir with root's tree and describes each difference: a
// page missing, different or left over. No differences: nil.
func Diff(root *cobra.Command, dir string) ([]string, error) {
	pages, err := Generate(root)
	if err != nil {
		return nil, err
	}
	var diffs []string
	for name, want := range pages {
		got, err := os.ReadFile(filepath.Join(dir, name))
		switch {
		case os.IsNotExist(err):
			diffs = append(diffs, name+": missing")
		case err != nil:
			return nil, err
		case !bytes.Equal(got, want):
			diffs = append(diffs, name+": differs")
		}
	}
	have, err := owned(root, dir)
	if err != nil {
		return nil, err
	}
	for _, name := range have {
		if _, ok := pages[name]; !ok {
			diffs = append(diffs, name+": no such command")
		}
	}
	slices.Sort(diffs)
	return diffs, nil
}

// owned lists the pages in dir that belong to root's tree by name:
// ROOT.md and ROOT_*.md.
func owned(root *cobra.Command, dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if n == root.Name()+".md" || strings.HasPrefix(n, root.Name()+"_") && strings.HasSuffix(n, ".md") {
			names = append(names, n)
		}
	}
	return names, nil
}
