// Command tinyinit is /init of the tiny guest image (see package
// guestimage): a stand-in for cloud-init that is small and boots in
// seconds under TCG. It loads the kernel modules shipped in /modules, reads
// the NoCloud seed from the CD-ROM labelled cidata or from a disk
// partition whose FAT filesystem is labelled CIDATA (where Corral's deploy
// writes it), and applies a subset of what cloud-init would: hostname
// (meta-data / user-data), the login users with their SSH keys
// (user-data; meta-data's public-keys go to Debian's default user
// "debian"), write_files (plain content), and static addresses and routes
// on the NICs matched by MAC (network-config v2), and lists the NICs.
// Then it starts Debian's dropbear SSH server, reports on the console with
// lines starting "CORRAL-TINY", ending with "CORRAL-TINY cloud-init done"
// (once per boot), and does cloud-config phone_home (vendor-data or
// user-data): a POST of instance_id, hostname and fqdn to the URL. It is
// not cloud-init: nothing else of cloud-config is read. The ACPI power
// button powers the guest off.
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
)

func say(format string, a ...any) { fmt.Printf("CORRAL-TINY "+format+"\n", a...) }

// warn says on the console what failed. Init goes on regardless: a guest
// missing one piece still answers most of what a test asks, and the line
// says why the rest does not.
func warn(what string, err error) {
	if err != nil {
		say("%s: %v", what, err)
	}
}

// mount mounts fstype on target; one the kernel mounted already is fine.
func mount(fstype, target, data string) {
	if err := unix.Mount(fstype, target, fstype, 0, data); err != nil && !errors.Is(err, unix.EBUSY) {
		say("mount %s: %v", target, err)
	}
}

func main() {
	start := time.Now()
	for _, d := range []string{"/dev", "/proc", "/sys", "/tmp", "/run", "/etc/dropbear", "/root", "/home"} {
		warn("mkdir", os.MkdirAll(d, 0o755))
	}
	mount("devtmpfs", "/dev", "")
	mount("proc", "/proc", "")
	mount("sysfs", "/sys", "")
	warn("mkdir", os.MkdirAll("/dev/pts", 0o755))
	mount("devpts", "/dev/pts", "ptmxmode=0666,mode=0620")
	mount("tmpfs", "/tmp", "mode=1777")
	say("init started")
	if out, err := exec.Command("/bin/busybox", "--install", "-s", "/bin").CombinedOutput(); err != nil {
		say("busybox --install: %v %s", err, out)
	}
	warn("ping_group_range", os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0o644))
	loadModules("/modules")
	go powerButton()
	setLoopback()

	files, dev := findSeed(60 * time.Second)
	if files == nil {
		say("no cidata seed found")
		select {}
	}
	say("seed=%s", dev)
	meta := parse(files[cloudinit.MetaData])
	user := parse(files[cloudinit.UserData])
	vendor := parse(files[vendorData])
	host := str(user["hostname"])
	if host == "" {
		host = str(meta["local-hostname"])
	}
	if host != "" {
		warn("sethostname", unix.Sethostname([]byte(host)))
		warn("hostname", os.WriteFile("/etc/hostname", []byte(host+"\n"), 0o644))
	}
	say("hostname=%s instance-id=%s", host, str(meta["instance-id"]))

	users := []string{"root:x:0:0:root:/root:/bin/sh"}
	groups := []string{"root:x:0:"}
	keysFor := map[string][]string{"root": strs(user["ssh_authorized_keys"])}
	uid := 1000
	userList := list(user["users"])
	// meta-data's public-keys are the default user's, as cloud-init
	// gives them on Debian's images; only a seed that has some gets it.
	if pk := strs(meta["public-keys"]); len(pk) > 0 {
		userList = append(userList, map[string]any{"name": defaultUser, "ssh_authorized_keys": toAny(pk)})
	}
	for _, u := range userList {
		m, ok := u.(map[string]any)
		if !ok {
			continue
		}
		name := str(m["name"])
		if name == "" {
			continue
		}
		home := "/home/" + name
		users = append(users, fmt.Sprintf("%s:*:%d:%d::%s:/bin/sh", name, uid, uid, home))
		groups = append(groups, fmt.Sprintf("%s:x:%d:", name, uid))
		keysFor[name] = append(keysFor[name], strs(m["ssh_authorized_keys"])...)
		writeKeys(home, uid, keysFor[name])
		say("user=%s uid=%d keys=%d", name, uid, len(keysFor[name]))
		for _, k := range keysFor[name] {
			f := strings.Fields(k)
			say("key user=%s type=%s comment=%s", name, f[0], f[len(f)-1])
		}
		uid++
	}
	writeKeys("/root", 0, keysFor["root"])
	warn("passwd", os.WriteFile("/etc/passwd", []byte(strings.Join(users, "\n")+"\n"), 0o644))
	warn("group", os.WriteFile("/etc/group", []byte(strings.Join(groups, "\n")+"\n"), 0o644))
	warn("shells", os.WriteFile("/etc/shells", []byte("/bin/sh\n"), 0o644))

	writeFiles(list(user["write_files"]))

	configureNetwork(parse(files[cloudinit.NetworkConfig]))
	listNICs()
	pid := startDropbear()
	say("cloud-init done after %.1fs", time.Since(start).Seconds())
	for _, doc := range []map[string]any{vendor, user} {
		if ph, ok := doc["phone_home"].(map[string]any); ok {
			go phoneHome(ph, str(meta["instance-id"]), host)
		}
	}
	reap(pid)
}

// vendorData is the NoCloud seed's vendor-data file; defaultUser is the
// user Debian's cloud images give meta-data's public-keys.
const (
	vendorData  = "vendor-data"
	defaultUser = "debian"
)

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// writeFiles applies cloud-config write_files: absolute paths, plain
// content, permissions as an octal string (default 0644), owned by root.
func writeFiles(files []any) {
	for _, f := range files {
		m, _ := f.(map[string]any)
		p := str(m["path"])
		if !filepath.IsAbs(p) || str(m["encoding"]) != "" {
			say("write_files: %q skipped (want an absolute path, plain content)", p)
			continue
		}
		mode := os.FileMode(0o644)
		if s := str(m["permissions"]); s != "" {
			if v, err := strconv.ParseUint(s, 8, 32); err == nil {
				mode = os.FileMode(v) & os.ModePerm
			}
		}
		warn("write_files", os.MkdirAll(filepath.Dir(p), 0o755))
		if err := os.WriteFile(p, []byte(str(m["content"])), mode); err != nil {
			say("write_files %s: %v", p, err)
			continue
		}
		warn("write_files", os.Chmod(p, mode))
		say("write_files path=%s mode=%#o", p, mode)
	}
}

// phoneHome does cloud-config phone_home: a form POST of the instance id,
// hostname and fqdn (cloud-init posts the host keys too) to url, tried up
// to tries times (cloud-init's default 10), 3 seconds apart.
func phoneHome(ph map[string]any, instanceID, host string) {
	u := strings.ReplaceAll(str(ph["url"]), "$INSTANCE_ID", instanceID)
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		say("phone_home: no http(s) url")
		return
	}
	tries := 10
	if n, ok := ph["tries"].(float64); ok && n >= 1 && n <= 100 {
		tries = int(n)
	}
	form := url.Values{"instance_id": {instanceID}, "hostname": {host}, "fqdn": {host}}
	c := &http.Client{Timeout: 10 * time.Second}
	// The path's last segment is a secret: the console shows the host.
	shown := u
	if p, err := url.Parse(u); err == nil {
		shown = p.Scheme + "://" + p.Host
	}
	for i := 1; i <= tries; i++ {
		resp, err := c.PostForm(u, form)
		if err == nil {
			resp.Body.Close()
			say("phone_home %s try=%d status=%d", shown, i, resp.StatusCode)
			if resp.StatusCode/100 == 2 {
				return
			}
		} else {
			say("phone_home %s try=%d: %v", shown, i, errors.Unwrap(err))
		}
		time.Sleep(3 * time.Second)
	}
}

func parse(b []byte) map[string]any {
	m := map[string]any{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		say("parse seed file: %v", err)
	}
	return m
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

func strs(v any) []string {
	var out []string
	for _, x := range list(v) {
		if s := str(x); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func writeKeys(home string, uid int, keys []string) {
	warn("keys", os.MkdirAll(filepath.Join(home, ".ssh"), 0o700))
	warn("keys", os.WriteFile(filepath.Join(home, ".ssh", "authorized_keys"), []byte(strings.Join(keys, "\n")+"\n"), 0o600))
	for _, p := range []string{home, filepath.Join(home, ".ssh"), filepath.Join(home, ".ssh", "authorized_keys")} {
		warn("keys", os.Chown(p, uid, uid))
	}
	warn("keys", os.Chmod(home, 0o755))
}

func ip(args ...string) error {
	out, err := exec.Command("/bin/busybox", append([]string{"ip"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func setLoopback() {
	if err := ip("link", "set", "lo", "up"); err != nil {
		say("%v", err)
	}
}

// configureNetwork applies network-config v2 ethernets: match by MAC,
// set-name, static addresses, routes.
func configureNetwork(nc map[string]any) {
	eths, _ := nc["ethernets"].(map[string]any)
	names := make([]string, 0, len(eths))
	for n := range eths {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, id := range names {
		e, _ := eths[id].(map[string]any)
		match, _ := e["match"].(map[string]any)
		mac := strings.ToLower(str(match["macaddress"]))
		dev := findNIC(mac, 30*time.Second)
		if dev == "" {
			say("network %s: no NIC with MAC %s", id, mac)
			continue
		}
		if want := str(e["set-name"]); want != "" && want != dev {
			if err := ip("link", "set", dev, "name", want); err != nil {
				say("%v", err)
			} else {
				dev = want
			}
		}
		if err := ip("link", "set", dev, "up"); err != nil {
			say("%v", err)
		}
		for _, a := range strs(e["addresses"]) {
			if err := ip("addr", "add", a, "dev", dev); err != nil {
				say("%v", err)
				continue
			}
			say("address dev=%s mac=%s addr=%s", dev, mac, a)
		}
		for _, r := range list(e["routes"]) {
			m, _ := r.(map[string]any)
			to, via := str(m["to"]), str(m["via"])
			if to == "0.0.0.0/0" || to == "::/0" {
				to = "default"
				if strings.Contains(via, ":") {
					to = "-6 default"
				}
			}
			args := append(strings.Fields("route add "+to), "via", via, "dev", dev)
			if err := ip(args...); err != nil {
				say("%v", err)
				continue
			}
			say("route dev=%s to=%s via=%s", dev, str(m["to"]), via)
		}
		if ns, ok := e["nameservers"].(map[string]any); ok {
			var b strings.Builder
			for _, a := range strs(ns["addresses"]) {
				fmt.Fprintf(&b, "nameserver %s\n", a)
			}
			if s := strs(ns["search"]); len(s) > 0 {
				fmt.Fprintf(&b, "search %s\n", strings.Join(s, " "))
			}
			warn("resolv.conf", os.WriteFile("/etc/resolv.conf", []byte(b.String()), 0o644))
		}
	}
}

// listNICs prints every network interface with its MAC.
func listNICs() {
	nics, _ := filepath.Glob("/sys/class/net/*/address")
	for _, n := range nics {
		mac, _ := os.ReadFile(n)
		say("nic %s mac=%s", filepath.Base(filepath.Dir(n)), strings.TrimSpace(string(mac)))
	}
}

func findNIC(mac string, wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		addrs, _ := filepath.Glob("/sys/class/net/*/address")
		for _, a := range addrs {
			b, _ := os.ReadFile(a)
			if strings.TrimSpace(string(b)) == mac {
				return filepath.Base(filepath.Dir(a))
			}
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startDropbear() int {
	cmd := exec.Command("/usr/sbin/dropbear", "-R", "-F", "-E", "-p", "22", "-P", "/run/dropbear.pid")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		say("dropbear: %v", err)
		return 0
	}
	say("sshd started pid=%d", cmd.Process.Pid)
	return cmd.Process.Pid
}

// reap collects every child (init's duty) and restarts dropbear if it
// exits.
func reap(dropbear int) {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, syscall.SIGCHLD)
	for {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == dropbear {
				say("sshd exited (%v); restarting", ws)
				time.Sleep(time.Second)
				dropbear = startDropbear()
			}
		}
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
		}
	}
}

func loadModules(dir string) {
	mods, _ := filepath.Glob(filepath.Join(dir, "*.ko"))
	loaded := map[string]bool{}
	for progress := true; progress; {
		progress = false
		for _, m := range mods {
			if loaded[m] {
				continue
			}
			f, err := os.Open(m)
			if err != nil {
				continue
			}
			err = unix.FinitModule(int(f.Fd()), "", 0)
			f.Close()
			if err == nil || err == unix.EEXIST {
				loaded[m] = true
				progress = true
			}
		}
	}
	say("modules loaded=%d of %d", len(loaded), len(mods))
}

func findSeed(wait time.Duration) (map[string][]byte, string) {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if files, dev := diskSeed(); files != nil {
			return files, dev
		}
		devs, _ := filepath.Glob("/dev/sr*")
		for _, d := range devs {
			f, err := os.Open(d)
			if err != nil {
				continue
			}
			label, files, err := cloudinit.ReadISO(f)
			f.Close()
			if err == nil && strings.EqualFold(label, cloudinit.Label) {
				return files, d
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil, ""
}

// powerButton powers off on KEY_POWER from any input device.
func powerButton() {
	seen := map[string]bool{}
	for {
		evs, _ := filepath.Glob("/dev/input/event*")
		for _, e := range evs {
			if seen[e] {
				continue
			}
			seen[e] = true
			go func(path string) {
				f, err := os.Open(path)
				if err != nil {
					return
				}
				buf := make([]byte, 24)
				for {
					if _, err := f.Read(buf); err != nil {
						return
					}
					typ, code := binary.LittleEndian.Uint16(buf[16:]), binary.LittleEndian.Uint16(buf[18:])
					if typ == 1 && code == 116 { // EV_KEY, KEY_POWER
						say("poweroff")
						unix.Sync()
						warn("poweroff", unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF))
					}
				}
			}(e)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// diskSeed reads the seed from the first disk partition whose FAT
// filesystem is labelled CIDATA (the label in the boot sector: offset 43
// for FAT12/16, 71 for FAT32), mounted read-only.
func diskSeed() (map[string][]byte, string) {
	parts, _ := filepath.Glob("/sys/class/block/*/partition")
	for _, p := range parts {
		dev := "/dev/" + filepath.Base(filepath.Dir(p))
		if !fatLabelled(dev) {
			continue
		}
		const dir = "/run/cidata"
		warn("mkdir", os.MkdirAll(dir, 0o755))
		if err := unix.Mount(dev, dir, "vfat", unix.MS_RDONLY, ""); err != nil {
			say("mount %s: %v", dev, err)
			continue
		}
		files := map[string][]byte{}
		for _, n := range []string{cloudinit.MetaData, cloudinit.UserData, vendorData, cloudinit.NetworkConfig} {
			if b, err := os.ReadFile(filepath.Join(dir, n)); err == nil {
				files[n] = b
			}
		}
		warn("umount", unix.Unmount(dir, 0))
		return files, dev
	}
	return nil, ""
}

func fatLabelled(dev string) bool {
	f, err := os.Open(dev)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 512)
	if _, err := io.ReadFull(f, b); err != nil || b[510] != 0x55 || b[511] != 0xaa {
		return false
	}
	for _, off := range []int{43, 71} {
		if strings.EqualFold(strings.TrimSpace(string(b[off:off+11])), cloudinit.Label) {
			return true
		}
	}
	return false
}
