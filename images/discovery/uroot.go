package discovery

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/u-root/gobusybox/src/pkg/golang"
	"github.com/u-root/mkuimage/uimage"
	"github.com/u-root/mkuimage/uimage/builder"
	"github.com/u-root/mkuimage/uimage/initramfs"
	"github.com/u-root/uio/llog"
)

// URootModule is the module whose core commands (and init) make the
// image's userland. Its version is the one go.mod pins.
const URootModule = "github.com/u-root/u-root"

// AgentBuildTag builds corral-node without its hypervisor mode.
const AgentBuildTag = "corral_discovery"

// AgentPackage is the uinit: `corral-node discover`.
const AgentPackage = "cmd/corral-node"

// goModule returns the directory and version of module mod as resolved by
// srcDir's go.mod, downloading it through the module proxy when needed.
func goModule(ctx context.Context, srcDir, mod string) (dir, version string, err error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", mod)
	cmd.Dir = srcDir
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("go mod download %s: %v: %s", mod, err, stderrOf(err))
	}
	var m struct{ Dir, Version, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", "", fmt.Errorf("go mod download %s: %s", mod, m.Error)
	}
	return m.Dir, m.Version, nil
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// genprotoAfterSplit is a google.golang.org/genproto without the
// googleapis/rpc packages (see buildUroot).
const genprotoAfterSplit = "v0.0.0-20231106174013-bbf56f31fb17"

// Commands are the u-root v0.16.0 commands the image ships, as paths
// under the module's cmds/: all of cmds/core except those a discovery
// image has no use for and whose weight would break the 10 MB budget next
// to the driver set: sshd, scp and gpgv (SSH and OpenPGP stacks), kexec
// (u-root's boot loaders), strace, man (embedded pages), MSR/port I/O
// pokers, watchdogs, FUSE, service management and time sync; and gosh
// (mvdan.cc/sh plus a TUI line editor, ~1 MB compressed), replaced by
// u-root's small rush shell from cmds/exp as /bin/sh.
var Commands = []string{
	"core/backoff", "core/base64", "core/basename", "core/blkid", "core/brctl", "core/cat", "core/chmod",
	"core/chroot", "core/cmp", "core/comm", "core/cp", "core/cpio", "core/date", "core/dd", "core/df",
	"core/dhclient", "core/dirname", "core/dmesg", "core/du", "core/echo", "core/false", "core/find",
	"core/free", "core/gpt", "core/grep", "core/gzip", "core/head", "core/hexdump", "core/hostname", "core/id",
	"core/init", "core/insmod", "core/ip", "core/kill", "core/ln", "core/losetup", "core/ls", "core/lsdrivers",
	"core/lsfd", "core/lsmod", "core/mkdir", "core/mkfifo", "core/mknod", "core/mktemp", "core/more",
	"core/mount", "core/mv", "core/netcat", "core/netstat", "core/nohup", "core/pci", "core/pidof", "core/ping",
	"core/poweroff", "core/printenv", "core/ps", "core/pwd", "core/readlink", "core/realpath", "core/rm",
	"core/rmmod", "core/seq", "core/shasum", "core/shutdown", "core/sleep", "core/sort", "core/stty",
	"core/switch_root", "core/sync", "core/tail", "core/tar", "core/tee", "core/time", "core/timeout",
	"core/touch", "core/tr", "core/true", "core/truncate", "core/tty", "core/umount", "core/uname", "core/uniq",
	"core/unmount", "core/uptime", "core/wc", "core/wget", "core/which", "core/xargs", "core/yes",
	"exp/rush",
}

// Shell is the image's /bin/sh (for an operator on the console after the
// agent exits or from the u-root init's fallback).
const Shell = "rush"

// envMu serialises builds: the Go workspace is chosen through GOWORK in
// the process environment, which mkuimage's go invocations inherit.
var envMu sync.Mutex

// urootBuild is one u-root initramfs build.
type urootBuild struct {
	srcDir, urootDir string
	arch             string // GOARCH
	commands         []string
	version          string   // stamped into corral-node
	tag              string   // corral-node build tag ("": none)
	uinitArgs        []string // corral-node's arguments as the uinit
	work, out        string
	// extra are mkuimage's extra files ("src:dst"); ELF files among them
	// bring their shared libraries (ldd), at the libraries' own paths.
	extra []string
}

// buildUroot writes an uncompressed newc archive to b.out: u-root's
// commands and corral-node (srcDir/cmd/corral-node, built with b.tag) in
// one gobusybox binary, init → u-root init, /bin/uinit → corral-node with
// b.uinitArgs, /bin/sh → rush, plus b.extra. It builds offline apart from
// the module proxy: a Go workspace in b.work holds a writable copy of the
// u-root module and srcDir's module.
func buildUroot(ctx context.Context, log *slog.Logger, b urootBuild) error {
	srcDir, urootDir, commands, version, work, out, extra := b.srcDir, b.urootDir, b.commands, b.version, b.work, b.out, b.extra
	ws := filepath.Join(work, "ws")
	uroot := filepath.Join(ws, "u-root")
	if err := copyTree(urootDir, uroot); err != nil {
		return fmt.Errorf("copy u-root source: %w", err)
	}
	// u-root's module graph holds the monolithic google.golang.org/genproto
	// of 2019, which still contains googleapis/rpc/status; grpc imports
	// that package from the split-off genproto/googleapis/rpc module, so
	// the merged workspace graph has it twice ("ambiguous import").
	// Requiring a genproto from after the split (November 2023) drops it
	// from the monolith.
	cmd := exec.CommandContext(ctx, "go", "mod", "edit", "-require=google.golang.org/genproto@"+genprotoAfterSplit)
	cmd.Dir = uroot
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go mod edit: %v\n%s", err, b)
	}
	cmd = exec.CommandContext(ctx, "go", "work", "init", uroot, srcDir)
	cmd.Dir = ws
	cmd.Env = append(os.Environ(), "GOWORK=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go work init: %v\n%s", err, b)
	}
	tmp := filepath.Join(work, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	envMu.Lock()
	defer envMu.Unlock()
	restore := setenv(map[string]string{"GOWORK": filepath.Join(ws, "go.work"), "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0"})
	defer restore()

	var pkgs []string
	for _, c := range commands {
		pkgs = append(pkgs, filepath.Join(uroot, "cmds", c))
	}
	pkgs = append(pkgs, filepath.Join(srcDir, AgentPackage))
	// The GOROOT of the go on PATH (the one that made the workspace):
	// gobusybox otherwise takes runtime.GOROOT(), which is empty in a
	// binary built with -trimpath (make release's corrald).
	gr, err := exec.CommandContext(ctx, "go", "env", "GOROOT").Output()
	if err != nil {
		return fmt.Errorf("go env GOROOT: %w", err)
	}
	envOpts := []golang.Opt{golang.WithWorkingDir(ws), golang.DisableCGO(), golang.WithGOOS("linux"), golang.WithGOARCH(cmp.Or(b.arch, ArchAMD64)),
		golang.WithGOROOT(strings.TrimSpace(string(gr)))}
	if b.tag != "" {
		envOpts = append(envOpts, golang.WithBuildTag(b.tag))
	}
	env := golang.Default(envOpts...)
	l := llog.New(slog.LevelInfo, func(format string, v ...any) {
		log.Debug("u-root: " + strings.TrimSpace(fmt.Sprintf(format, v...)))
	})
	opts := uimage.Opts{
		Env: env,
		Commands: []uimage.Commands{{
			Builder:  builder.Busybox,
			Packages: pkgs,
			// gobusybox keeps each command's import path, so main.version
			// is github.com/corralhq/corral/cmd/corral-node.version. The
			// flags repeat gobusybox's defaults: the last -ldflags wins.
			// gobusybox also passes -a, which recompiles the standard
			// library and every dependency on every build (minutes on two
			// cores); -a=false after it lets go build take them from its
			// content-addressed cache, as any go build does.
			BuildOpts: &golang.BuildOpts{ExtraArgs: []string{
				"-a=false",
				"-ldflags=-s -w -buildid= -X github.com/corralhq/corral/" + AgentPackage + ".version=" + version,
			}},
		}},
		TempDir:      tmp,
		ExtraFiles:   extra,
		SkipLDD:      cmp.Or(b.arch, ArchAMD64) != ArchAMD64, // a foreign closure is in extra already (elfroot.Closure)
		OutputFile:   &initramfs.CPIOFile{Path: out},
		InitCmd:      "init",
		UinitCmd:     "corral-node",
		UinitArgs:    b.uinitArgs,
		DefaultShell: Shell,
	}
	done := make(chan error, 1)
	go func() { done <- uimage.CreateInitramfs(l, opts) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func setenv(vars map[string]string) func() {
	old := map[string]*string{}
	for k, v := range vars {
		if o, ok := os.LookupEnv(k); ok {
			old[k] = &o
		} else {
			old[k] = nil
		}
		os.Setenv(k, v)
	}
	return func() {
		for k, o := range old {
			if o == nil {
				os.Unsetenv(k)
			} else {
				os.Setenv(k, *o)
			}
		}
	}
}

// copyTree copies a directory tree, making everything writable (the module
// cache is read-only).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		t := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(t, 0o755)
		case d.Type().IsRegular():
			return copyFile(p, t)
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, t)
		}
		return nil
	})
}
