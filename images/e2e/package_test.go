package e2e

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/require"
)

// debianRootCache holds a minbase Debian root made by mmdebstrap (the
// first run needs the mirror, ~1 min; later runs unpack the tarball in
// seconds).
const debianRootCache = "/var/cache/corral/debian-root"

// debianMirror is where mmdebstrap fetches it (given explicitly: with none
// it would read sources.list lines from a stdin that is not a terminal).
const debianMirror = "http://deb.debian.org/debian"

// TestDebInstall is the operator's path from the release to a booted
// machine: the .deb is built with nfpm from packaging/nfpm.yaml (static
// corrald and corral, the unit, the default config, the images archive
// `corrald images export` makes from what `corrald images build`
// registered), installed with dpkg -i into a clean minbase Debian root
// (chroot; the postinst creates the corral user and /var/lib/corral and
// imports the images), its files, modes and conffile checked, the
// installed unit accepted by systemd-analyze verify. Then the INSTALLED
// corrald, run as the corral user with only the unit's three capabilities,
// imports the packaged archive into a fresh data directory, serves with
// the packaged /etc/corral/corrald.yaml and PXE-boots a QEMU machine until
// it is INVENTORIED. A tampered archive is refused by its hash and leaves
// the catalog as it was.
func TestDebInstall(t *testing.T) {
	need(t, "ip", "qemu-system-x86_64", "dpkg", "dpkg-deb", "chroot", "mmdebstrap", "systemd-analyze", "setpriv", "tar")
	nfpm := filepath.Join(srcDir, ".bin", "nfpm")
	if _, err := os.Stat(nfpm); err != nil {
		require.Tool(t, "nfpm") // make tools installs it into .bin
		nfpm, _ = exec.LookPath("nfpm")
	}
	bothImages(t) // the images build below then comes from the cache
	work := t.TempDir()

	// 1. What make release does, into work/dist.
	t0 := time.Now()
	dist := filepath.Join(work, "dist")
	build := exec.Command("go", "build", "-trimpath", "-o", dist+"/", "github.com/corralhq/corral/cmd/corrald", "github.com/corralhq/corral/cmd/corral")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Dir = srcDir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build: %v\n%s", err, out)
	}
	for _, b := range []string{"corrald", "corral"} {
		f, err := elf.Open(filepath.Join(dist, b))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked (has an ELF interpreter)", b)
			}
		}
		f.Close()
	}
	catalog := filepath.Join(work, "catalog")
	mustRun(t, filepath.Join(dist, "corrald"), "images", "build", "--data-dir", catalog, "--image-cache", imageCache(), "--source", srcDir)
	archive := filepath.Join(dist, "corral-images.tar")
	out := mustRun(t, filepath.Join(dist, "corrald"), "images", "export", "--data-dir", catalog, "-o", archive)
	t.Logf("corrald images export:\n%s", out)
	os.RemoveAll(catalog)
	// nfpm runs where packaging/nfpm.yaml's relative paths resolve.
	for _, f := range []string{"packaging/nfpm.yaml", "packaging/corrald.service", "packaging/corrald.yaml", "packaging/postinst", "packaging/prerm", "packaging/postrm", "README.md",
		"packaging/prometheus/corral-alerts.yml", "packaging/prometheus/corral-alerts.test.yml", "packaging/prometheus/corral-dashboard.json"} {
		copyFile(t, filepath.Join(srcDir, f), filepath.Join(work, f))
	}
	pkg := exec.Command(nfpm, "pkg", "-f", "packaging/nfpm.yaml", "-p", "deb", "-t", dist+"/")
	pkg.Dir = work
	pkg.Env = append(os.Environ(), "CORRAL_DEB_VERSION=0.0.0+e2e")
	if out, err := pkg.CombinedOutput(); err != nil {
		t.Fatalf("nfpm: %v\n%s", err, out)
	}
	deb := filepath.Join(dist, "corral_0.0.0+e2e_amd64.deb")
	st, err := os.Stat(deb)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s (%d bytes) in %s", filepath.Base(deb), st.Size(), time.Since(t0).Round(100*time.Millisecond))

	// 2. dpkg -i into a clean Debian root.
	t0 = time.Now()
	root := debianRoot(t, work)
	copyFile(t, deb, filepath.Join(root, "tmp", filepath.Base(deb)))
	out = mustRun(t, "chroot", root, "dpkg", "-i", "/tmp/"+filepath.Base(deb))
	t.Logf("dpkg -i in a minbase root (%s):\n%s", time.Since(t0).Round(100*time.Millisecond), out)
	if status := mustRun(t, "chroot", root, "dpkg-query", "-W", "-f", "${Status} ${Version}", "corral"); status != "install ok installed 0.0.0+e2e" {
		t.Errorf("dpkg-query: %q", status)
	}
	uid, gid := lookupUser(t, root, "corral")
	for _, f := range []struct {
		path string
		mode os.FileMode
		uid  int
	}{
		{"/usr/bin/corrald", 0o755, 0},
		{"/usr/bin/corral", 0o755, 0},
		{"/lib/systemd/system/corrald.service", 0o644, 0},
		{"/etc/corral/corrald.yaml", 0o644, 0},
		{"/usr/share/corral/images/corral-images.tar", 0o644, 0},
		{"/usr/share/corral/prometheus/corral-alerts.yml", 0o644, 0},
		{"/usr/share/corral/prometheus/corral-alerts.test.yml", 0o644, 0},
		{"/usr/share/corral/prometheus/corral-dashboard.json", 0o644, 0},
		{"/var/lib/corral", os.ModeDir | 0o700, uid},
		{"/var/lib/corral/images/discover.json", 0o644, uid},
		{"/var/lib/corral/images/hypervisor.json", 0o644, uid},
		{"/var/lib/corral/images/imported.json", 0o644, uid},
	} {
		st, err := os.Stat(filepath.Join(root, f.path))
		if err != nil {
			t.Errorf("installed root: %v", err)
			continue
		}
		if st.Mode()&(os.ModeType|os.ModePerm) != f.mode {
			t.Errorf("%s: mode %v, want %v", f.path, st.Mode(), f.mode)
		}
		if own := int(st.Sys().(*syscall.Stat_t).Uid); own != f.uid {
			t.Errorf("%s: owner uid %d, want %d", f.path, own, f.uid)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "var/lib/dpkg/info/corral.conffiles")); strings.TrimSpace(string(b)) != "/etc/corral/corrald.yaml" {
		t.Errorf("conffiles = %q, want /etc/corral/corrald.yaml", b)
	}
	if got, want := fileSHA(t, filepath.Join(root, "usr/share/corral/images/corral-images.tar")), fileSHA(t, archive); got != want {
		t.Errorf("packaged archive sha256 %s, built %s", got, want)
	}
	for _, f := range []string{"corral-alerts.yml", "corral-alerts.test.yml", "corral-dashboard.json"} {
		if got, want := fileSHA(t, filepath.Join(root, "usr/share/corral/prometheus", f)), fileSHA(t, filepath.Join(srcDir, "packaging/prometheus", f)); got != want {
			t.Errorf("packaged %s sha256 %s, repository's %s", f, got, want)
		}
	}

	// 3. systemd-analyze verify accepts the installed unit (its ExecStart
	// pointed at the installed binary: verify checks it is executable).
	unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/corrald.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "ExecStart=/usr/bin/corrald serve --config /etc/corral/corrald.yaml --data-dir /var/lib/corral",
		"User=corral", "AmbientCapabilities=CAP_NET_BIND_SERVICE CAP_NET_RAW CAP_NET_ADMIN", "ProtectSystem=strict", "WatchdogSec="} {
		if !strings.Contains(string(unit), "\n"+want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	verifyDir := filepath.Join(work, "verify")
	os.MkdirAll(verifyDir, 0o755)
	vunit := filepath.Join(verifyDir, "corrald.service")
	os.WriteFile(vunit, bytes.ReplaceAll(unit, []byte("ExecStart=/usr/bin/corrald"), []byte("ExecStart="+filepath.Join(root, "usr/bin/corrald"))), 0o644)
	if out, err := exec.Command("systemd-analyze", "verify", vunit).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	// 4. The installed corrald, as the corral user with the unit's
	// capabilities, on a fresh data directory.
	l := newLab(t)
	// The corral user must reach the installed root and the data
	// directory (t.TempDir makes 0700 directories).
	for _, d := range []string{filepath.Dir(work), work, root, l.dir} {
		os.Chmod(d, 0o755)
	}
	data := filepath.Join(l.dir, "data")
	os.MkdirAll(data, 0o700)
	os.Chown(data, uid, gid)
	asCorral := []string{"setpriv", "--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid), "--clear-groups",
		"--inh-caps=-all,+net_bind_service,+net_raw,+net_admin", "--ambient-caps=-all,+net_bind_service,+net_raw,+net_admin",
		"--bounding-set=-all,+net_bind_service,+net_raw,+net_admin"}
	installed := filepath.Join(root, "usr/bin/corrald")
	packaged := filepath.Join(root, "usr/share/corral/images/corral-images.tar")
	out = mustRun(t, asCorral[0], append(asCorral[1:], installed, "images", "import", "--data-dir", data, "--sha256", fileSHA(t, packaged), packaged)...)
	t.Logf("installed corrald images import:\n%s", out)

	// A tampered archive: refused by the hash, naming the file; the
	// catalog stays as it was.
	before := dirSums(t, data)
	tampered := filepath.Join(work, "tampered.tar")
	tamper(t, packaged, tampered, "initrd.img")
	cmd := exec.Command(asCorral[0], append(asCorral[1:], installed, "images", "import", "--data-dir", data, tampered)...)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "initrd.img: sha256") || !strings.Contains(string(out), "nothing was registered") {
		t.Errorf("tampered archive: err %v, want refused naming initrd.img\n%s", err, out)
	} else {
		t.Logf("tampered archive refused: %s", lastLine(string(out)))
	}
	if after := dirSums(t, data); after != before {
		t.Errorf("catalog changed by a refused import:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	serve := append(append([]string{"netns", "exec", l.ns}, asCorral...), installed, "serve", "--config", filepath.Join(root, "etc/corral/corrald.yaml"),
		"--data-dir", data, "--log-level", "debug", "--api-listen", l.subnet+".1:20180", "--boot-interface", l.bridge,
		"--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--dhcp-router", l.subnet+".1")
	c := &corrald{proc: start(t, l.dir, "corrald.log", "ip", serve...), t: t, ns: l.ns, dataDir: data}
	waitAPI(t, c)
	disk := disks(t, l.dir, "DISK-A")
	mac := fmt.Sprintf("52:54:00:%s:%s:0d", l.id[:2], l.id[2:4])
	args := append(qemuBase(memoryMB, cpus), "-boot", "n",
		"-netdev", "tap,id=n0,ifname="+l.tap("t"+l.id[:4]+"d")+",script=no,downscript=no", "-device", "e1000,netdev=n0,mac="+mac)
	args = append(append(args, smbios()...), disk...)
	t0 = time.Now()
	vm := start(t, l.dir, "console-deb.log", "ip", append([]string{"netns", "exec", l.ns}, args...)...)
	m := c.waitMachine(vm, bootTimeout, "with serial "+serial+" INVENTORIED", func(m machine) bool {
		return m.Serial == serial && m.State == "INVENTORIED"
	})
	t.Logf("PXE boot from the imported images to INVENTORIED: %s (machine %s, boot MAC %s)", time.Since(t0).Round(time.Second), m.Name, m.BootMAC)
	// The installed CLI talks to it too.
	ls := exec.Command("ip", "netns", "exec", l.ns, filepath.Join(root, "usr/bin/corral"), "--config", filepath.Join(data, "admin.conf"), "get", "machines")
	if out, err := ls.CombinedOutput(); err != nil || !strings.Contains(string(out), "INVENTORIED") {
		t.Errorf("installed corral get machines: %v\n%s", err, out)
	}
}

// debianRoot unpacks the cached minbase bookworm root into dir/root,
// making the cache with mmdebstrap first when it is missing.
func debianRoot(t *testing.T, dir string) string {
	t.Helper()
	cache := filepath.Join(debianRootCache, "bookworm-minbase.tar")
	if _, err := os.Stat(cache); err != nil {
		if err := os.MkdirAll(debianRootCache, 0o755); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(debianRootCache, fmt.Sprintf(".bookworm-minbase.%d.tar", os.Getpid()))
		defer os.Remove(tmp)
		t0 := time.Now()
		if out, err := exec.Command("mmdebstrap", "--variant=minbase", "--quiet", "bookworm", tmp, debianMirror).CombinedOutput(); err != nil {
			t.Fatalf("mmdebstrap: %v\n%s", err, out)
		}
		if err := os.Rename(tmp, cache); err != nil {
			t.Fatal(err)
		}
		t.Logf("mmdebstrap --variant=minbase bookworm: %s (cached in %s)", time.Since(t0).Round(time.Second), cache)
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "tar", "-x", "-f", cache, "-C", root)
	return root
}

// mustRun runs a command and returns its output, failing the test on error.
func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(string(out), 4096))
	}
	return strings.TrimSpace(string(out))
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(src)
	if err := os.WriteFile(dst, b, st.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	out := mustRun(t, "sha256sum", path)
	return strings.Fields(out)[0]
}

// lookupUser reads name's uid and gid from root's /etc/passwd.
func lookupUser(t *testing.T, root, name string) (int, int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 4 && f[0] == name {
			uid, _ := strconv.Atoi(f[2])
			gid, _ := strconv.Atoi(f[3])
			return uid, gid
		}
	}
	t.Fatalf("no user %s in the installed root's /etc/passwd", name)
	return 0, 0
}

// dirSums lists every file under dir with its size and modification time
// (directories by name only: an import stages in a temporary directory
// it removes again).
func dirSums(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := d.Info(); err == nil && !d.IsDir() {
			fmt.Fprintf(&b, "%s %v %d %d\n", p, info.Mode(), info.Size(), info.ModTime().UnixNano())
		} else {
			fmt.Fprintf(&b, "%s/\n", p)
		}
		return nil
	})
	return b.String()
}

// tamper copies the archive src to dst with one byte of the file name
// changed (same size: only its hash tells).
func tamper(t *testing.T, src, dst, name string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	tr, tw := tar.NewReader(in), tar.NewWriter(out)
	done := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		tw.WriteHeader(h)
		if h.Name != name {
			io.Copy(tw, tr)
			continue
		}
		b, _ := io.ReadAll(tr)
		b[len(b)/2] ^= 0x40
		tw.Write(b)
		done = true
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if !done {
		t.Fatalf("%s has no %s", src, name)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// waitAPI waits until c's admin.conf exists and its API answers.
func waitAPI(t *testing.T, c *corrald) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(c.dataDir, "admin.conf")); err == nil {
			if _, err := c.cli("get", "machines"); err == nil {
				return
			}
		}
		select {
		case <-c.done:
			t.Fatalf("corrald exited:\n%s", tail(c.console.String(), 4096))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("corrald did not come up in 90s:\n%s", tail(c.console.String(), 4096))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
