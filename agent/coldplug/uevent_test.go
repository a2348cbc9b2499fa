package coldplug

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/testsupport/require"
)

// fakeEvents hands out queued events, then ErrNoEvent at the deadline.
type fakeEvents struct {
	mu     sync.Mutex
	queue  []any // Uevent or error
	closed bool
}

func (f *fakeEvents) push(items ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = append(f.queue, items...)
}

func (f *fakeEvents) Next(deadline time.Time) (Uevent, error) {
	for {
		f.mu.Lock()
		if len(f.queue) > 0 {
			it := f.queue[0]
			f.queue = f.queue[1:]
			f.mu.Unlock()
			if err, ok := it.(error); ok {
				return Uevent{}, err
			}
			return it.(Uevent), nil
		}
		f.mu.Unlock()
		if !time.Now().Before(deadline) {
			return Uevent{}, ErrNoEvent
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *fakeEvents) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// eventLoader announces virtio_pci's children as the kernel does:
// uevents only (sysfs is left as it was), or with overflow, in sysfs
// with the events lost.
type eventLoader struct {
	root     string
	events   *fakeEvents
	overflow bool
	mu       sync.Mutex
	loaded   []string
}

func (l *eventLoader) Load(name string) error {
	l.mu.Lock()
	l.loaded = append(l.loaded, name)
	l.mu.Unlock()
	if name != "virtio_pci" {
		return nil
	}
	if l.overflow {
		write(l.root, "sys/devices/pci0000:00/0000:00:03.0/virtio0/modalias", "virtio:d00000001v00001AF4\n")
		l.events.push(ErrOverflow)
		return nil
	}
	l.events.push(
		Uevent{Action: "add", DevPath: "/devices/pci0000:00/0000:00:03.0/virtio0", Modalias: "virtio:d00000001v00001AF4"},
		Uevent{Action: "bind", DevPath: "/devices/pci0000:00/0000:00:03.0"},
		Uevent{Action: "add", DevPath: "/devices/virtual/bdi/252:0"},
		Uevent{Action: "add", DevPath: "/devices/pci0000:00/0000:00:04.0/virtio1", Modalias: "virtio:d00000002v00001AF4"},
	)
	return nil
}

func TestRunWithUevents(t *testing.T) {
	for name, tc := range map[string]struct {
		overflow   bool
		hold       string
		wantLoaded []string
	}{
		"children announced by uevents, sysfs not walked again": {wantLoaded: []string{"virtio_pci", "virtio_net", "virtio_blk"}},
		"a held module is reported, not loaded":                 {hold: "virtio_net", wantLoaded: []string{"virtio_pci", "virtio_blk"}},
		"events lost: sysfs walked":                             {overflow: true, wantLoaded: []string{"virtio_pci", "virtio_net"}},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			write(root, "sys/devices/pci0000:00/0000:00:03.0/modalias", "pci:v00001AF4d00001041sv00001AF4sd00000001bc02sc00i00\n")
			write(root, "lib/modules/test/modules.alias", modulesAlias)
			ev := &fakeEvents{}
			l := &eventLoader{root: root, events: ev, overflow: tc.overflow}
			w := NewWatch()
			res, err := Run(context.Background(), Config{
				Root: root, ModulesDir: filepath.Join(root, "lib/modules/test"), Loader: l, Events: ev, Watch: w, Settle: 50 * time.Millisecond,
				Hold: func(m string) bool { return m == tc.hold },
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantLoaded, res.Loaded); diff != "" {
				t.Errorf("loaded (-want +got):\n%s", diff)
			}
			if slices.Contains(l.loaded, tc.hold) || (tc.hold != "" && !slices.Equal(res.Held, []string{tc.hold})) {
				t.Errorf("held %q: loader got %q, Held = %q", tc.hold, l.loaded, res.Held)
			}
			// virtio_pci's children are the second generation. An
			// event's generation counts from the loads finished when it is
			// read, so virtio1's event read after virtio_net loaded is a
			// third (the pipeline reads events and load results as they
			// come): 2 or 3, never 1 and never a round per module.
			if res.Rounds < 2 || res.Rounds > 3 {
				t.Errorf("rounds = %d, want 2 (or 3)", res.Rounds)
			}
			if !ev.closed {
				t.Error("events not closed")
			}
			if err := w.Wait(context.Background(), func() bool { return false }); err != nil {
				t.Errorf("Wait after Run = %v, want nil (finished)", err)
			}
		})
	}
}

// slowLoader holds e1000's load until virtio_net has loaded: a slow
// driver must not hold up the children of a fast one.
type slowLoader struct {
	*eventLoader
	netLoaded chan struct{}
	once      sync.Once
}

func (l *slowLoader) Load(name string) error {
	switch name {
	case "e1000":
		select {
		case <-l.netLoaded:
		case <-time.After(3 * time.Second):
			return errors.New("held up: virtio_net never loaded while e1000 was loading")
		}
	case "virtio_net":
		defer l.once.Do(func() { close(l.netLoaded) })
	}
	return l.eventLoader.Load(name)
}

func TestRunDoesNotWaitForSlowModules(t *testing.T) {
	root := t.TempDir()
	write(root, "sys/devices/pci0000:00/0000:00:03.0/modalias", "pci:v00001AF4d00001041sv00001AF4sd00000001bc02sc00i00\n")
	write(root, "sys/devices/pci0000:00/0000:00:05.0/modalias", "pci:v00008086d0000100Esv00001AF4sd00001100bc02sc00i00\n")
	write(root, "lib/modules/test/modules.alias", modulesAlias)
	ev := &fakeEvents{}
	l := &slowLoader{eventLoader: &eventLoader{root: root, events: ev}, netLoaded: make(chan struct{})}
	res, err := Run(context.Background(), Config{
		Root: root, ModulesDir: filepath.Join(root, "lib/modules/test"), Loader: l, Events: ev, Settle: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) > 0 {
		t.Errorf("failed: %v", res.Failed)
	}
	if diff := cmp.Diff([]string{"virtio_pci", "e1000", "virtio_net", "virtio_blk"}, res.Loaded); diff != "" {
		t.Errorf("loaded (-want +got):\n%s", diff)
	}
}

func TestParseUevent(t *testing.T) {
	for name, tc := range map[string]struct {
		msg    string
		want   Uevent
		wantOK bool
	}{
		"add with modalias": {
			msg:    "add@/devices/pci0000:00/0000:00:03.0/virtio1\x00ACTION=add\x00DEVPATH=/devices/pci0000:00/0000:00:03.0/virtio1\x00SUBSYSTEM=virtio\x00MODALIAS=virtio:d00000002v00001AF4\x00SEQNUM=1234\x00",
			want:   Uevent{Action: "add", DevPath: "/devices/pci0000:00/0000:00:03.0/virtio1", Modalias: "virtio:d00000002v00001AF4"},
			wantOK: true,
		},
		"header only":          {msg: "remove@/devices/virtual/net/tap0", want: Uevent{Action: "remove", DevPath: "/devices/virtual/net/tap0"}, wantOK: true},
		"udev's re-broadcast":  {msg: "libudev\x00\xfe\xed\xca\xfe"},
		"no device path":       {msg: "add@\x00ACTION=add\x00"},
		"empty":                {msg: ""},
		"value with an equals": {msg: "change@/devices/x\x00MODALIAS=acpi:A=B:\x00", want: Uevent{Action: "change", DevPath: "/devices/x", Modalias: "acpi:A=B:"}, wantOK: true},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := ParseUevent([]byte(tc.msg))
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseUevent(f *testing.F) {
	f.Add([]byte("add@/devices/x\x00MODALIAS=pci:v1\x00"))
	f.Add([]byte("libudev\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, ok := ParseUevent(b)
		if ok && (ev.Action == "" || ev.DevPath == "") {
			t.Errorf("ParseUevent(%q) = %+v, ok with an empty field", b, ev)
		}
	})
}

func TestWatch(t *testing.T) {
	t.Run("ready after a round", func(t *testing.T) {
		w := NewWatch()
		var mu sync.Mutex
		ready := false
		done := make(chan error, 1)
		go func() {
			done <- w.Wait(context.Background(), func() bool { mu.Lock(); defer mu.Unlock(); return ready })
		}()
		select {
		case err := <-done:
			t.Fatalf("Wait returned %v before anything was ready", err)
		case <-time.After(20 * time.Millisecond):
		}
		w.Signal() // a round without it: still waiting
		select {
		case err := <-done:
			t.Fatalf("Wait returned %v before anything was ready", err)
		case <-time.After(20 * time.Millisecond):
		}
		mu.Lock()
		ready = true
		mu.Unlock()
		w.Signal()
		if err := <-done; err != nil {
			t.Errorf("Wait = %v", err)
		}
	})
	t.Run("coldplug over, never ready", func(t *testing.T) {
		w := NewWatch()
		done := make(chan error, 1)
		go func() { done <- w.Wait(context.Background(), func() bool { return false }) }()
		w.Finish()
		w.Finish()
		w.Signal()
		if err := <-done; err != nil {
			t.Errorf("Wait = %v", err)
		}
	})
	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := NewWatch().Wait(ctx, func() bool { return false }); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait = %v, want context.Canceled", err)
		}
	})
}

// TestUeventSocket: the kernel's uevent socket delivers an event the
// kernel sends (a synthetic "change" of the loopback device, which
// changes nothing).
func TestUeventSocket(t *testing.T) {
	require.Root(t, "the uevent socket needs CAP_NET_ADMIN")
	ev, err := ListenUevents()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := os.WriteFile("/sys/class/net/lo/uevent", []byte("change"), 0o200); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		e, err := ev.Next(deadline)
		if err != nil {
			t.Fatalf("no event for lo: %v", err)
		}
		if e.Action == "change" && e.DevPath == "/devices/virtual/net/lo" {
			return
		}
	}
}
