// Package elfroot resolves an ELF program's closure inside an unpacked
// root of another architecture, from the files themselves.
package elfroot

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// A foreign architecture's ELF files cannot be ldd'd on the build host
// (ldd runs the host's ld.so), so an image for one carries the closure
// resolved here from the files themselves: PT_INTERP, then DT_NEEDED
// searched in DT_RPATH/DT_RUNPATH ($ORIGIN expanded) and Debian's
// multiarch and plain library directories, recursively. Every path is
// resolved inside the unpacked root: absolute symlink targets are taken
// relative to it and ".." stops at it, so nothing outside it is read.

// maxSymlinks bounds the symlinks followed resolving one path (Linux's
// own limit is 40).
const maxSymlinks = 40

// maxClosure bounds the files of one closure (QEMU's is about 200).
const maxClosure = 2000

// errLoop: more than maxSymlinks symlinks on one path (paths never
// escape the root: they are clamped at it).
var errLoop = errors.New("too many levels of symbolic links")

// ResolveIn resolves rel (a path inside root, absolute or not) with every
// symlink followed inside root, and returns the resolved path relative to
// root (slash-separated, no leading slash).
func ResolveIn(root, rel string) (string, error) {
	todo := strings.Split(strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(rel)), "/"), "/")
	var done []string
	hops := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		cur := make([]string, len(done), len(done)+1)
		copy(cur, done)
		cur = append(cur, c)
		p := filepath.Join(root, filepath.FromSlash(strings.Join(cur, "/")))
		st, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		if st.Mode()&os.ModeSymlink == 0 {
			done = cur
			continue
		}
		if hops++; hops > maxSymlinks {
			return "", fmt.Errorf("%s: %w", rel, errLoop)
		}
		t, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(t, "/") {
			done = nil
		}
		todo = append(strings.Split(filepath.ToSlash(t), "/"), todo...)
	}
	return strings.Join(done, "/"), nil
}

// libDirs are where Debian's ld.so looks for arch's libraries (its
// multiarch directories first).
func libDirs(arch string) []string {
	triplet := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[arch]
	return []string{"lib/" + triplet, "usr/lib/" + triplet, "lib", "usr/lib"}
}

// elfMachine is arch's ELF machine.
func elfMachine(arch string) elf.Machine {
	if arch == "arm64" {
		return elf.EM_AARCH64
	}
	return elf.EM_X86_64
}

// File is one file of a closure: Dst is where the image has it (the
// path it was asked for or found at), Src the regular file inside root
// that path resolves to (both relative to root).
type File struct{ Dst, Src string }

// Closure returns the files paths (inside root) need to run on arch (a
// GOARCH: amd64 or arm64):
// the paths themselves, their interpreter and their DT_NEEDED libraries,
// recursively, sorted by Dst. A path that is not ELF is carried as it is.
// A library that is not found, or an ELF file of another machine, is an
// error.
func Closure(root, arch string, paths []string) ([]File, error) {
	seen := map[string]bool{}
	var out []File
	var visit func(dst string) error
	visit = func(dst string) error {
		dst = strings.TrimPrefix(path.Clean("/"+dst), "/")
		if seen[dst] {
			return nil
		}
		if len(seen) >= maxClosure {
			return fmt.Errorf("%s: closure of more than %d files", root, maxClosure)
		}
		seen[dst] = true
		src, err := ResolveIn(root, dst)
		if rest, ok := strings.CutPrefix(dst, "usr/"); err != nil && ok {
			// A root unpacked without merged /usr keeps /sbin/mke2fs
			// where the image (and a merged host) has /usr/sbin/mke2fs.
			src, err = ResolveIn(root, rest)
		}
		if err != nil {
			return fmt.Errorf("/%s: %w", dst, err)
		}
		full := filepath.Join(root, filepath.FromSlash(src))
		st, err := os.Stat(full)
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("/%s: not a regular file", dst)
		}
		out = append(out, File{Dst: dst, Src: src})
		f, err := elf.Open(full)
		if err != nil {
			var fe *elf.FormatError
			if errors.As(err, &fe) {
				return nil // not ELF (a config file): carried as is
			}
			return fmt.Errorf("/%s: %w", dst, err)
		}
		defer f.Close()
		if f.Machine != elfMachine(arch) {
			return fmt.Errorf("/%s: ELF for %s, not %s", dst, f.Machine, arch)
		}
		for _, p := range f.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return fmt.Errorf("/%s: PT_INTERP: %w", dst, err)
			}
			if err := visit(strings.TrimRight(string(b), "\x00")); err != nil {
				return err
			}
		}
		needed, err := f.DynString(elf.DT_NEEDED)
		if err != nil || len(needed) == 0 {
			return nil // static, or no dynamic section
		}
		var search []string
		for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
			rp, _ := f.DynString(tag)
			for _, r := range rp {
				for _, d := range strings.Split(r, ":") {
					d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", "$ORIGIN"), "$ORIGIN", "/"+path.Dir(src))
					if d != "" {
						search = append(search, strings.TrimPrefix(path.Clean("/"+d), "/"))
					}
				}
			}
		}
		search = append(search, libDirs(arch)...)
		for _, n := range needed {
			if strings.Contains(n, "/") {
				if err := visit(n); err != nil {
					return err
				}
				continue
			}
			found := false
			for _, d := range search {
				cand := d + "/" + n
				r, err := ResolveIn(root, cand)
				if err != nil {
					continue
				}
				if lf, err := elf.Open(filepath.Join(root, filepath.FromSlash(r))); err == nil {
					ok := lf.Machine == elfMachine(arch)
					lf.Close()
					if !ok {
						continue
					}
				} else {
					continue
				}
				if err := visit(cand); err != nil {
					return err
				}
				found = true
				break
			}
			if !found {
				return fmt.Errorf("/%s: %s not found in %s", dst, n, strings.Join(search, ", "))
			}
		}
		return nil
	}
	for _, p := range paths {
		if err := visit(p); err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst < out[j].Dst })
	return out, nil
}
