package corral_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The size of the rooms (docs/architecture.md, "The composition root and
// its features"): no hand-written Go file over maxFileLines, and boot/dhcp,
// the hot path, split so that none of its files passes maxDHCPFileLines.
// `go test -run TestHouseSizes -v .` prints every package's non-test lines
// and exported identifiers and the largest files, the figures a renovation
// is measured by.
const (
	maxFileLines     = 900
	maxDHCPFileLines = 600
)

type pkgSize struct{ lines, exported int }

// exportedDecls counts a file's exported top-level identifiers: functions,
// methods on exported types, types, variables and constants.
func exportedDecls(f *ast.File) int {
	n := 0
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv != nil && len(d.Recv.List) > 0 {
				t := d.Recv.List[0].Type
				if s, ok := t.(*ast.StarExpr); ok {
					t = s.X
				}
				if ix, ok := t.(*ast.IndexExpr); ok {
					t = ix.X
				}
				if id, ok := t.(*ast.Ident); ok && !id.IsExported() {
					continue
				}
			}
			n++
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						n++
					}
				case *ast.ValueSpec:
					for _, name := range s.Names {
						if name.IsExported() {
							n++
						}
					}
				}
			}
		}
	}
	return n
}

func TestHouseSizes(t *testing.T) {
	pkgs := map[string]*pkgSize{}
	type file struct {
		path  string
		lines int
	}
	var files []file
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		if pkgs[dir] == nil {
			pkgs[dir] = &pkgSize{}
		}
		lines := strings.Count(string(src), "\n")
		pkgs[dir].lines += lines
		pkgs[dir].exported += exportedDecls(f)
		files = append(files, file{filepath.ToSlash(path), lines})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	dirs := make([]string, 0, len(pkgs))
	for d := range pkgs {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		t.Logf("%-40s %6d lines %4d exported", d, pkgs[d].lines, pkgs[d].exported)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].lines > files[j].lines })
	for _, f := range files[:min(5, len(files))] {
		t.Logf("largest: %5d %s", f.lines, f.path)
	}
	for _, f := range files {
		switch {
		case f.lines > maxFileLines:
			t.Errorf("%s: %d lines, over %d: split it along a seam", f.path, f.lines, maxFileLines)
		case strings.HasPrefix(f.path, "boot/dhcp/") && f.lines > maxDHCPFileLines:
			t.Errorf("%s: %d lines, over boot/dhcp's %d", f.path, f.lines, maxDHCPFileLines)
		}
	}
}
