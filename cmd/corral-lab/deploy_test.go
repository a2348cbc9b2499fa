package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/guestimage"
	"github.com/corralhq/corral/testsupport/require"
	"golang.org/x/sys/unix"
)

// deployed is the part of a Machine record the deploy test reads.
type deployed struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	StateReason string `json:"state_reason"`
	Deployment  struct {
		DeploymentID string `json:"deployment_id"`
		Address      string `json:"address"`
		Step         string `json:"step"`
		Error        string `json:"error"`
		UserData     string `json:"user_data"`
	} `json:"deployment"`
	Erase struct {
		Level string `json:"level"`
		Error string `json:"error"`
		Step  string `json:"step"`
	} `json:"erase"`
}

func (r *rack) deployedMachine(name string) deployed {
	r.t.Helper()
	var m deployed
	if err := json.Unmarshal(r.mustCorral("get", "machine", name, "-o", "json"), &m); err != nil {
		r.t.Fatal(err)
	}
	return m
}

// TestLabDeploy: the virtual rack deploys an operating system onto
// machines for people (docs/operator-guide.md, "Deploying an operating
// system"): a BIOS machine, a UEFI one and a UEFI one with two NVMe disks
// are commissioned (checkCommissioning) and accepted into a pool; 64 concurrent allocations for two of them get
// exactly two; a Debian image with the real cloud-init (built here with
// mmdebstrap) is uploaded and deployed to each with an SSH key; each
// boots it from its disk, phones home (DEPLOYED) and answers SSH with the
// key on the address Corral assigned (the NVMe machine with a RAID1
// layout: an ESP on each disk and the root on a RAID1 of both, which
// /proc/mdstat shows active over SSH); released with --erase full, a
// machine's disks read back zero; --erase secure on the NVMe machine
// formats its namespaces (NVMe Format) and is refused on virtio disks.
func TestLabDeploy(t *testing.T) {
	need(t)
	require.Tool(t, guestimage.CloudInitTools...)
	require.Tool(t, "ssh", "ssh-keygen")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cache, err := guestimage.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	img, err := guestimage.CloudInit(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Debian cloud-init image %s (cached %t) in %s", img.Path, img.Cached, time.Since(t0).Round(time.Second))

	r := up(t, "--machines", "3", "--with-bmc", "--firmware", "bios,uefi,uefi", "--disk-bus", "virtio,virtio,nvme",
		"--accept=false", "--until", "inventoried", "--wait", "10m", "--memory", "2048")
	st := r.st
	names := []string{}
	for _, m := range st.Machines {
		names = append(names, m.Name)
	}
	ms := r.machines()
	// Commissioning first, on the NVMe machine (passes quick) and the BIOS
	// one (fails link-10g, is refused for accept, cleared): the virtual
	// rack's commissioning check, sharing this test's machines.
	checkCommissioning(t, r, ms[names[2]].Name, ms[names[0]].Name)
	for _, lm := range st.Machines {
		r.mustCorral("machine", "accept", ms[lm.Name].Name, "--target", "pool")
	}

	// 64 concurrent allocations for the two machines of pool "race": two win.
	a, b := ms[names[0]].Name, ms[names[1]].Name
	r.mustCorral("label", "machine", a, "pool=race")
	r.mustCorral("label", "machine", b, "pool=race")
	var (
		mu  sync.Mutex
		won []string
		wg  sync.WaitGroup
	)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := r.corral("machine", "allocate", "--pool", "race", "-o", "json")
			if err == nil {
				mu.Lock()
				won = append(won, string(out))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(won) != 2 {
		t.Fatalf("64 concurrent allocations for 2 machines: %d succeeded, want 2:\n%s", len(won), strings.Join(won, "\n"))
	}
	// The third is allocated for the deploy too.
	r.mustCorral("label", "machine", ms[names[2]].Name, "pool=nvme")
	r.mustCorral("machine", "allocate", "--pool", "nvme")

	// The image; CORRAL_LAB_DEPLOY_MIB grows a copy of it (qcow2: the
	// growth is empty) for the power-on → SSH benchmark (bench/README.md,
	// "OS-image deploy and erase").
	image := img.Path
	if v := os.Getenv("CORRAL_LAB_DEPLOY_MIB"); v != "" {
		image = filepath.Join(t.TempDir(), "grown.qcow2")
		if out, err := exec.Command("cp", "--sparse=always", img.Path, image).CombinedOutput(); err != nil {
			t.Fatalf("copy the image: %v\n%s", err, out)
		}
		if out, err := exec.Command("qemu-img", "resize", "-f", "qcow2", image, v+"M").CombinedOutput(); err != nil {
			t.Fatalf("CORRAL_LAB_DEPLOY_MIB=%s: qemu-img resize: %v\n%s", v, err, out)
		}
	}
	r.mustCorral("--timeout", "5m", "osimage", "upload", "debian", image, "--format", "qcow2")
	r.waitFor("OS image READY", 5*time.Minute, func() bool {
		out, err := r.corral("get", "os_image", "debian", "-o", "json")
		return err == nil && strings.Contains(string(out), "OS_IMAGE_STATE_READY")
	})

	keyDir := t.TempDir()
	key := filepath.Join(keyDir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	userData := filepath.Join(keyDir, "user-data")
	if err := os.WriteFile(userData, []byte("#cloud-config\nwrite_files:\n  - path: /etc/corral-deployed\n    content: \"deployed by corral: it works\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The NVMe machine gets a RAID1 layout: an ESP on each disk (the
	// image's boot partition copied onto both) and the root filesystem on
	// a RAID1 of the rest; the others keep the whole-disk default.
	raidLayout := filepath.Join(keyDir, "raid1.yaml")
	if err := os.WriteFile(raidLayout, []byte(`disks:
  - {name: d0, table: gpt, partitions: [{name: esp0, size: 128M, type: esp}, {name: r0, type: raid}]}
  - {name: d1, table: gpt, partitions: [{name: esp1, size: 128M, type: esp}, {name: r1, type: raid}]}
raids: [{name: md0, level: raid1, devices: [r0, r1], filesystem: ext4, mount: /}]
image: md0
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	for i, n := range names {
		m := ms[n].Name
		args := []string{"machine", "deploy", m, "--image", "debian", "--ssh-key", key + ".pub", "--hostname", "deployed-" + n, "--user-data", userData}
		if i == 2 {
			args = append(args, "--layout", raidLayout)
		}
		r.mustCorral(args...)
	}
	// Per machine: deploy → DEPLOYED (phoned home) → first SSH answer.
	phoned, sshed := map[string]time.Duration{}, map[string]time.Duration{}
	r.waitFor("every machine DEPLOYED (its OS phoned home)", 20*time.Minute, func() bool {
		all := true
		for _, n := range names {
			if _, ok := phoned[n]; ok {
				continue
			}
			d := r.deployedMachine(ms[n].Name)
			if d.State == "FAILED" {
				r.logs()
				t.Fatalf("%s: deploy FAILED: %s (%s)", n, d.StateReason, d.Deployment.Error)
			}
			if d.State != "DEPLOYED" {
				all = false
				continue
			}
			phoned[n] = time.Since(t0)
		}
		return all
	})
	t.Logf("power-on to phoned home, three machines at once: %s", time.Since(t0).Round(time.Second))

	for _, n := range names {
		d := r.deployedMachine(ms[n].Name)
		if d.Deployment.UserData != "" {
			t.Errorf("%s: the API returned the deploy's user data", n)
		}
		addr, _, _ := strings.Cut(d.Deployment.Address, "/")
		out, err := r.ssh(key, addr, "hostname; cat /etc/corral-deployed; ip -4 -o addr show")
		if err != nil {
			t.Errorf("%s: ssh debian@%s: %v\n%s", n, addr, err, out)
			continue
		}
		sshed[n] = time.Since(t0)
		lm := labMachine(st, n)
		t.Logf("deploy figures: %s (%s, %d disks): deploy → phoned home %s, → SSH answered %s (three deploys at once, image %s)",
			n, lm.Firmware, len(lm.Disks), phoned[n].Round(time.Second), sshed[n].Round(time.Second), image)
		if !strings.Contains(out, "deployed-"+n) || !strings.Contains(out, "deployed by corral: it works") || !strings.Contains(out, " "+d.Deployment.Address+" ") {
			t.Errorf("%s: over SSH: want hostname deployed-%s, the user data's file and address %s:\n%s", n, n, d.Deployment.Address, out)
		}
		if n != names[2] {
			continue
		}
		// The RAID1 root: both NVMe members active ([2/2] [UU], resyncing
		// or not) and / mounted from the array.
		out, err = r.ssh(key, addr, "cat /proc/mdstat; findmnt -n -o SOURCE,FSTYPE /")
		t.Logf("%s: /proc/mdstat and the root over SSH:\n%s", n, out)
		if err != nil {
			t.Errorf("%s: ssh: %v", n, err)
			continue
		}
		if !strings.Contains(out, "active raid1") || strings.Count(out, "nvme") < 2 || !strings.Contains(out, "[2/2] [UU]") {
			t.Errorf("%s: /proc/mdstat: want an active raid1 of both NVMe disks, [2/2] [UU]:\n%s", n, out)
		}
		if !strings.Contains(out, "/dev/md") || !strings.Contains(out, "ext4") {
			t.Errorf("%s: / is not the ext4 on the array:\n%s", n, out)
		}
	}

	// Release: full on the BIOS machine, secure on the NVMe one, and secure
	// refused on virtio (the agent says why; the machine ends FAILED until
	// erased again).
	full, nvme, virtio := ms[names[0]].Name, ms[names[2]].Name, ms[names[1]].Name
	r.mustCorral("machine", "release", full, "--erase", "full")
	r.mustCorral("machine", "release", nvme, "--erase", "secure")
	r.mustCorral("machine", "release", virtio, "--erase", "secure")
	r.waitFor("the erased machines READY", 15*time.Minute, func() bool {
		f, s, v := r.deployedMachine(full), r.deployedMachine(nvme), r.deployedMachine(virtio)
		for _, d := range []deployed{f, s} {
			if d.State == "FAILED" {
				r.logs()
				t.Fatalf("%s: erase FAILED: %s (%s)", d.Name, d.StateReason, d.Erase.Error)
			}
		}
		return f.State == "READY" && s.State == "READY" && v.State == "FAILED"
	})
	if v := r.deployedMachine(virtio); !strings.Contains(v.Erase.Error, "secure erase") {
		t.Errorf("%s: secure erase on virtio: error %q, want the reason", virtio, v.Erase.Error)
	}
	tl := string(r.mustCorral("machine", "timeline", nvme, "-o", "json"))
	if !strings.Contains(strings.ToLower(tl), "nvme format") {
		t.Errorf("%s: no NVMe format on the timeline", nvme)
	}
	for _, n := range []string{names[0], names[2]} {
		lm := labMachine(st, n)
		r.waitFor(n+" powered off", 3*time.Minute, func() bool {
			// "lab-1: power OFF (via native-ipmi)"
			return strings.Contains(string(r.mustCorral("machine", "power", "status", ms[n].Name)), "power OFF")
		})
		for _, d := range lm.Disks {
			if err := allZero(d.Path); err != nil {
				t.Errorf("%s: disk %s after release --erase: %v", n, d.Serial, err)
			}
		}
	}

	// The two erased machines, READY and free again, make a standby pool:
	// held powered off, then booted, refilled after an allocation.
	t.Run("standby", func(t *testing.T) { checkStandbyPool(t, r, []string{full, nvme}) })
}

// ssh runs cmd as the image's default user on addr from inside the lab's
// namespace, with retries while sshd comes up.
func (r *rack) ssh(key, addr, cmd string) (string, error) {
	var out []byte
	var err error
	for range 20 {
		out, err = exec.Command("ip", "netns", "exec", r.st.Namespace, "ssh", "-i", key,
			"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
			"-o", "BatchMode=yes", "debian@"+addr, cmd).CombinedOutput()
		if err == nil {
			return string(out), nil
		}
		time.Sleep(5 * time.Second)
	}
	return string(out), err
}

// allZero reads the data regions of the raw disk file (SEEK_DATA: holes
// read as zeros) and reports the first non-zero byte.
func allZero(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	var off int64
	for off < fi.Size() {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for p := data; p < hole; {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-p)], p)
			for i := range n {
				if buf[i] != 0 {
					return fmt.Errorf("byte %d is %#x, not zero", p+int64(i), buf[i])
				}
			}
			p += int64(n)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
		off = hole
	}
	return nil
}
