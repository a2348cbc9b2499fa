package coldplug

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const modulesAlias = `# Aliases extracted from modules themselves.
alias pci:v00001AF4d*sv*sd*bc*sc*i* virtio_pci
alias virtio:d00000001v* virtio_net
alias virtio:d00000002v* virtio_blk
alias pci:v00008086d0000100Esv*sd*bc*sc*i* e1000
alias pci:v*d*sv*sd*bc01sc06i01* ahci
alias pci:v0000BEEFd*sv*sd*bc*sc*i* broken
alias acpi*:PNP0A03:* pci_root
`

// fakeLoader records loads; loading virtio_pci makes two virtio devices
// appear, as the real bus driver does.
type fakeLoader struct {
	root   string
	mu     sync.Mutex
	loaded []string
}

func (f *fakeLoader) Load(name string) error {
	if name == "broken" {
		return errors.New("exec format error")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loaded = append(f.loaded, name)
	if name == "virtio_pci" {
		write(f.root, "sys/devices/pci0000:00/0000:00:03.0/virtio0/modalias", "virtio:d00000001v00001AF4\n")
		write(f.root, "sys/devices/pci0000:00/0000:00:04.0/virtio1/modalias", "virtio:d00000002v00001AF4\n")
	}
	return nil
}

func write(root, rel, content string) {
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte(content), 0o644)
}

func TestRun(t *testing.T) {
	for name, tc := range map[string]struct {
		devices    map[string]string
		hold       []string
		wantLoaded []string
		wantFailed []string
		wantHeld   []string
		wantRounds int
	}{
		"virtio children appear after the bus driver": {
			devices: map[string]string{
				"sys/devices/pci0000:00/0000:00:03.0/modalias": "pci:v00001AF4d00001041sv00001AF4sd00000001bc02sc00i00\n",
				"sys/devices/pci0000:00/0000:00:04.0/modalias": "pci:v00001AF4d00001042sv00001AF4sd00000002bc01sc00i00\n",
			},
			wantLoaded: []string{"virtio_pci", "virtio_net", "virtio_blk"},
			wantRounds: 2,
		},
		"e1000 and ahci, one broken module": {
			devices: map[string]string{
				"sys/devices/pci0000:00/0000:00:02.0/modalias": "pci:v00008086d0000100Esv00001AF4sd00001100bc02sc00i00\n",
				"sys/devices/pci0000:00/0000:00:1f.2/modalias": "pci:v00008086d00002922sv00001AF4sd00001100bc01sc06i01\n",
				"sys/devices/pci0000:00/0000:00:05.0/modalias": "pci:v0000BEEFd00000001sv00000000sd00000000bc0Csc80i00\n",
			},
			wantLoaded: []string{"e1000", "ahci"},
			wantFailed: []string{"broken"},
			wantRounds: 2,
		},
		"held modules are reported, not loaded": {
			devices: map[string]string{
				"sys/devices/pci0000:00/0000:00:03.0/modalias": "pci:v00001AF4d00001041sv00001AF4sd00000001bc02sc00i00\n",
				"sys/devices/pci0000:00/0000:00:02.0/modalias": "pci:v00008086d0000100Esv00001AF4sd00001100bc02sc00i00\n",
			},
			hold:       []string{"e1000", "virtio_blk"},
			wantLoaded: []string{"virtio_pci", "virtio_net"},
			wantHeld:   []string{"e1000", "virtio_blk"},
			wantRounds: 2,
		},
		"nothing matches": {
			devices:    map[string]string{"sys/devices/platform/serial8250/modalias": "platform:serial8250\n"},
			wantRounds: 1,
		},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			for rel, c := range tc.devices {
				write(root, rel, c)
			}
			write(root, "lib/modules/test/modules.alias", modulesAlias)
			l := &fakeLoader{root: root}
			res, err := Run(context.Background(), Config{
				Root: root, ModulesDir: filepath.Join(root, "lib/modules/test"), Loader: l, Settle: time.Millisecond,
				Hold: func(m string) bool { return slices.Contains(tc.hold, m) },
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantLoaded, res.Loaded); diff != "" {
				t.Errorf("loaded (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantHeld, res.Held); diff != "" {
				t.Errorf("held (-want +got):\n%s", diff)
			}
			if held := slices.DeleteFunc(slices.Clone(l.loaded), func(m string) bool { return !slices.Contains(tc.hold, m) }); len(held) > 0 {
				t.Errorf("held modules loaded: %q", held)
			}
			var failed []string
			for m := range res.Failed {
				failed = append(failed, m)
			}
			if diff := cmp.Diff(tc.wantFailed, failed); diff != "" {
				t.Errorf("failed (-want +got):\n%s", diff)
			}
			if res.Rounds > tc.wantRounds+1 {
				t.Errorf("rounds = %d, want at most %d", res.Rounds, tc.wantRounds+1)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	a, err := ParseAliases(strings.NewReader(modulesAlias + "garbage line\nalias only-two\n"))
	if err != nil {
		t.Fatal(err)
	}
	for modalias, want := range map[string][]string{
		"pci:v00001AF4d00001041sv00001AF4sd00000001bc02sc00i00": {"virtio_pci"},
		"pci:v00008086d00002922sv00001AF4sd00001100bc01sc06i01": {"ahci"},
		"virtio:d00000002v00001AF4":                             {"virtio_blk"},
		"usb:v1234p5678d0100dc00dsc00dp00ic08isc06ip50in00":     {},
	} {
		if diff := cmp.Diff(want, a.Match(modalias)); diff != "" {
			t.Errorf("Match(%s) (-want +got):\n%s", modalias, diff)
		}
	}
}

func TestRunNeedsAliases(t *testing.T) {
	if _, err := Run(context.Background(), Config{Root: t.TempDir(), ModulesDir: t.TempDir(), Loader: &fakeLoader{}}); err == nil {
		t.Error("Run without modules.alias succeeded")
	}
}
