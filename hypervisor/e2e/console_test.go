package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	consolev1 "github.com/corralhq/corral/api/console/v1"
	"github.com/corralhq/corral/testsupport/hvlab"
)

// lockedBuffer is a bytes.Buffer a process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitFor polls s() until it holds want.
func waitFor(t *testing.T, what string, s func() string, want string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for !strings.Contains(s(), want) {
		if time.Since(start) > timeout {
			t.Fatalf("%s lacks %q after %v:\n%s", what, want, timeout, tailString(s(), 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// viewer is a console stream read into a buffer.
type viewer struct {
	stream consolev1.ConsoleService_AttachClient
	out    lockedBuffer
	end    chan error
}

func attachVM(ctx context.Context, t *testing.T, l *hvlab.Lab, vm string, mode consolev1.ConsoleMode) *viewer {
	t.Helper()
	s, err := consolev1.NewConsoleServiceClient(l.Conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Open{Open: &consolev1.ConsoleOpen{Vm: vm, Mode: mode}}}); err != nil {
		t.Fatal(err)
	}
	v := &viewer{stream: s, end: make(chan error, 1)}
	go func() {
		for {
			o, err := s.Recv()
			if err != nil {
				v.end <- err
				return
			}
			if o.GetEvent() != consolev1.ConsoleEvent_CONSOLE_EVENT_UNSPECIFIED {
				_, _ = v.out.Write([]byte("[" + o.GetEvent().String() + "]"))
			}
			_, _ = v.out.Write(o.GetData())
		}
	}()
	return v
}

// checkVMConsole proves a running VM's serial console through its node
// and the appliance: `corral vm console` (the built CLI, a pipe for its
// keyboard) types a line the guest's terminal echoes back, a read-only
// viewer sees it and is refused when it types, ~. detaches, and a viewer
// attached afterwards gets the line from the appliance's scrollback.
func checkVMConsole(t *testing.T, l *hvlab.Lab, vm string) {
	t.Helper()
	began := time.Now()
	defer func() {
		figure(t, "vm serial console check (CLI writer, viewer, detach, scrollback): %v", time.Since(began).Round(time.Millisecond))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	keys, typer, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer typer.Close()
	var stdout, stderr lockedBuffer
	cli := exec.CommandContext(ctx, l.Bin.Corral(), "--config", l.AdminConf, "vm", "console", vm)
	cli.Env = append(os.Environ(), "HOME="+l.Dir)
	cli.Stdin, cli.Stdout, cli.Stderr = keys, &stdout, &stderr
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	keys.Close()
	exited := make(chan error, 1)
	go func() { exited <- cli.Wait() }()
	waitFor(t, "corral vm console's stderr", stderr.String, "[attached to "+vm+"'s console, write; ~. detaches]", 30*time.Second)

	watcher := attachVM(ctx, t, l, vm, consolev1.ConsoleMode_CONSOLE_MODE_READ_ONLY)
	waitFor(t, "read-only viewer", watcher.out.String, "[CONSOLE_EVENT_LIVE]", 10*time.Second)

	// The guest's init holds its console (ttyS0) open with echo on: a
	// line typed is echoed by the guest's kernel, so it has reached the
	// guest and come back.
	const line = "corral-console-typed-42"
	start := time.Now()
	if _, err := typer.Write([]byte(line + "\r")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "corral vm console's stdout", stdout.String, line, 30*time.Second)
	figure(t, "vm serial console: a typed line echoed by the guest, through corral vm console, corrald and the node (TCG): %v", time.Since(start).Round(time.Millisecond))
	waitFor(t, "read-only viewer", watcher.out.String, line, 10*time.Second)

	// A viewer's keys are refused.
	if err := watcher.stream.Send(&consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Data{Data: []byte("x")}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	select {
	case err := <-watcher.end:
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("read-only viewer typing: %v, want PermissionDenied", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("read-only viewer typing: its stream stayed open")
	}

	if _, err := typer.Write([]byte("~.")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil || !strings.Contains(stderr.String(), "[detached from "+vm+"]") {
			t.Errorf("corral vm console after ~.: %v\nstderr: %s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("corral vm console still running 10s after ~.; stderr:\n%s", stderr.String())
	}

	// The appliance kept the output: a later viewer gets it first.
	later := attachVM(ctx, t, l, vm, consolev1.ConsoleMode_CONSOLE_MODE_READ_ONLY)
	waitFor(t, "later viewer", later.out.String, "[CONSOLE_EVENT_LIVE]", 10*time.Second)
	if back, _, _ := strings.Cut(later.out.String(), "[CONSOLE_EVENT_LIVE]"); !strings.Contains(back, line) {
		t.Errorf("a viewer attached after the line was typed: scrollback lacks it:\n%s", tailString(back, 2000))
	}
	_ = later.stream.CloseSend()

	// Attach, detach and the refused viewer are in the audit stream, on
	// the VM.
	want := map[string]bool{"console attach write": false, "console attach read-only": false, "console detach": false}
	deadline := time.Now().Add(15 * time.Second)
	for missing := len(want); missing > 0; {
		evs, err := auditv1.NewAuditServiceClient(l.Conn).ListEvents(ctx, &auditv1.ListEventsRequest{Object: "virtualmachine/" + vm, PageSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.GetEvents() {
			if _, ok := want[e.GetAction()]; ok {
				want[e.GetAction()] = true
			}
		}
		missing = 0
		for _, seen := range want {
			if !seen {
				missing++
			}
		}
		if missing > 0 && time.Now().After(deadline) {
			t.Fatalf("audit events of virtualmachine/%s: %v seen", vm, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
