package discovery

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// MetaPackage is Debian's kernel meta package: it depends on the current
// versioned kernel package (linux-image-<abi>-amd64), which has every NIC
// and disk driver as a module (the cloud kernel lacks physical drivers).
const MetaPackage = "linux-image-amd64"

// KernelPackage is the versioned Debian kernel package the image uses.
type KernelPackage struct {
	Name    string // linux-image-6.1.0-56-amd64
	Version string // 6.1.192-2
	// Arch is a foreign (multiarch) architecture the package is fetched
	// for ("arm64"); empty for the host's amd64, so amd64 cache keys
	// stay what they were.
	Arch string `json:"Arch,omitempty"`
}

// Architectures the images are built for (Debian's and Go's names agree).
const (
	ArchAMD64 = "amd64"
	ArchARM64 = "arm64"
)

// Release is the kernel release (uname -r), e.g. 6.1.0-56-amd64.
func (k KernelPackage) Release() string { return strings.TrimPrefix(k.Name, "linux-image-") }

var releaseRE = regexp.MustCompile(`^linux-image-[0-9][0-9A-Za-z.+~-]*$`)

// ResolveKernel asks apt (from its local index: no download) which
// versioned package meta depends on and at which version.
func ResolveKernel(ctx context.Context, meta string) (KernelPackage, error) {
	m, err := aptShow(ctx, meta)
	if err != nil {
		return KernelPackage{}, err
	}
	dep := strings.TrimSpace(strings.Split(m["Depends"], ",")[0])
	dep, _, _ = strings.Cut(dep, " ")
	if !releaseRE.MatchString(dep) {
		return KernelPackage{}, fmt.Errorf("%s depends on %q, not a versioned kernel package", meta, m["Depends"])
	}
	p, err := aptShow(ctx, dep)
	if err != nil {
		return KernelPackage{}, err
	}
	return KernelPackage{Name: dep, Version: p["Version"]}, nil
}

func aptShow(ctx context.Context, pkg string) (map[string]string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "show", "--no-all-versions", pkg).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("apt-cache show %s: %v: %s (run apt-get update; for a foreign architecture dpkg --add-architecture first)", pkg, err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("apt-cache show %s: %w", pkg, err)
	}
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ": ")
		if ok && !strings.HasPrefix(k, " ") {
			if _, dup := fields[k]; !dup {
				fields[k] = v
			}
		}
	}
	if fields["Version"] == "" {
		return nil, fmt.Errorf("apt-cache show %s: no Version", pkg)
	}
	return fields, nil
}

// FetchKernel downloads k with `apt-get download` into debDir (kept as a
// cache: an existing .deb of that version is reused) and unpacks it with
// dpkg-deb -x into dir (not installed). It returns the .deb's path.
func FetchKernel(ctx context.Context, k KernelPackage, debDir, dir string) (string, error) {
	if err := os.MkdirAll(debDir, 0o755); err != nil {
		return "", err
	}
	// apt's _apt sandbox user must be able to write here. Best effort: a
	// directory another user owns keeps its mode, and apt-get says so
	// below if it then cannot write.
	_ = os.Chmod(debDir, 0o755)
	pattern := filepath.Join(debDir, k.Name+"_*.deb")
	deb := findDeb(pattern, k.Version)
	if deb == "" {
		name := k.Name
		if k.Arch != "" {
			// Needs `dpkg --add-architecture <arch>` and apt-get update.
			name += ":" + k.Arch
		}
		cmd := exec.CommandContext(ctx, "apt-get", "download", name+"="+k.Version)
		cmd.Dir = debDir
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get download %s=%s: %v\n%s", k.Name, k.Version, err, out)
		}
		if deb = findDeb(pattern, k.Version); deb == "" {
			return "", fmt.Errorf("apt-get download %s: no .deb in %s", k.Name, debDir)
		}
	}
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("dpkg-deb -x %s: %v\n%s", deb, err, out)
	}
	return deb, nil
}

// findDeb returns the .deb matching pattern whose version (the file
// name's second field, with ':' escaped as %3a) is version.
func findDeb(pattern, version string) string {
	ms, _ := filepath.Glob(pattern)
	want := strings.ReplaceAll(version, ":", "%3a")
	for _, m := range ms {
		parts := strings.Split(strings.TrimSuffix(filepath.Base(m), ".deb"), "_")
		if len(parts) == 3 && parts[1] == want {
			return m
		}
	}
	return ""
}
