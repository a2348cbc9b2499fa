package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/guestimage"
	"github.com/corralhq/corral/testsupport/hvlab"
	"github.com/corralhq/corral/testsupport/require"
)

// TestRealCloudInit boots the Debian image with the real cloud-init
// (built by mmdebstrap, cached) through the same path: Fetch, Register as
// an image, Generate a volume, CreateVirtualMachine. cloud-init must find
// the NoCloud seed on the virtio-scsi CD (console: DataSourceNoCloud) and
// apply hostname, user, key and static address, checked over SSH from the
// namespace. Building the image takes ~2 min the first time; booting to
// SSH under TCG 1-1.5 min on a quiet 2-core machine, 2.5 min at load 6.
// CORRAL_E2E_CLOUDINIT=0 skips it.
func TestRealCloudInit(t *testing.T) {
	need(t)
	if os.Getenv("CORRAL_E2E_CLOUDINIT") == "0" {
		t.Skip("CORRAL_E2E_CLOUDINIT=0")
	}
	require.Tool(t, guestimage.CloudInitTools...)
	key, pub := sshKey(t)
	cache, err := guestimage.CacheDir()
	if err != nil {
		require.Missing(t, "no cache directory: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	img, err := guestimage.CloudInit(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(img.Path)
	figure(t, "cloud-init image %s: %d MiB, cached=%v, %v", img.Path, st.Size()>>20, img.Cached, time.Since(start).Round(time.Millisecond))

	l := hvlab.New(t, bins, hvlab.Options{Files: map[string]string{"guest-cloudinit.qcow2": img.Path}})
	out, d := l.MustDo("register-cloudinit.yaml", fmt.Sprintf(`
Fetch:
  type: BlockStorage
  action: FetchBlockStorage
  args:
    name: debian-cloudinit-12
    annotations:
      n0core/provisioning/block_storage/request_node_name: vm-host1
    request_bytes: 1073741824
    limit_bytes: 10737418240
    source_url: %sguest-cloudinit.qcow2
ApplyImage:
  type: Image
  action: ApplyImage
  args: {name: cloudimage-ubuntu}
Register:
  type: Image
  action: RegisterBlockStorage
  args:
    image_name: cloudimage-ubuntu
    block_storage_name: debian-cloudinit-12
    tags: ["18.04"]
  depends_on: [Fetch, ApplyImage]
`, l.WebURL), 4)
	t.Logf("register in %v:\n%s", d.Round(time.Millisecond), out)

	createStart := time.Now()
	out, d = l.MustDo("ci-vm.yaml", vmDAG("ci-vm", "192.168.0.20", "ciuser", pub, 1024), 4)
	t.Logf("create in %v:\n%s", d.Round(time.Millisecond), out)
	if _, err := l.InNS(5*time.Second, "ip", "addr", "add", "192.168.0.254/24", "dev", bridgeOf("test-network")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.WaitConsole("ci-vm", 6*time.Minute, "DataSourceNoCloud"); err != nil {
		t.Fatal(err)
	}
	figure(t, "real cloud-init: create → console shows DataSourceNoCloud: %v", time.Since(createStart).Round(time.Millisecond))
	if d, err := l.WaitPing("192.168.0.20", 3*time.Minute); err != nil {
		t.Fatalf("%v\nconsole:\n%s", err, tail(l.Console("ci-vm"), 3000))
	} else {
		figure(t, "real cloud-init: create → ping answered: %v (waited %v)", time.Since(createStart).Round(time.Millisecond), d.Round(time.Millisecond))
	}
	got, _, err := sshRun(l, key, "ciuser", "192.168.0.20", "hostname; id -un; ip -4 -o addr show dev eth0; sudo -n true && echo sudo-ok", 4*time.Minute)
	if err != nil {
		t.Fatalf("ssh ciuser@192.168.0.20: %v\n%s\nconsole:\n%s", err, got, tail(l.Console("ci-vm"), 3000))
	}
	figure(t, "real cloud-init: create → SSH login with the seeded key: %v", time.Since(createStart).Round(time.Millisecond))
	t.Logf("over ssh:\n%s", got)
	for _, want := range []string{"ci-vm\n", "ciuser\n", "inet 192.168.0.20/24", "sudo-ok"} {
		if !strings.Contains(got, want) {
			t.Errorf("ssh output lacks %q", want)
		}
	}
	if _, err := l.WaitConsole("ci-vm", 3*time.Minute, "Cloud-init v.", "finished at"); err == nil {
		figure(t, "real cloud-init: create → cloud-init final stage finished: %v", time.Since(createStart).Round(time.Millisecond))
	} else {
		t.Logf("cloud-init final message not seen: %v", err)
	}
	l.MustDo("ci-vm-inverse.yaml", vmInverseDAG("ci-vm"), 4)
	assertVMGone(t, l, "ci-vm")
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
