package session

import (
	"context"
	"fmt"
	"sync"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// maxPending bounds the progress kept while no session is open.
const maxPending = 64

// jobs runs install and wipe plans one at a time, outside any one session:
// a plan keeps running when the stream breaks, and its progress goes to
// whichever session is open (kept, up to maxPending, while none is). Run
// owns it and waits for the running plan before returning. After a
// successful install it reboots the machine only when
// Config.InstallReboot is set.
type jobs struct {
	cfg *Config

	mu      sync.Mutex
	kind    string // "install" or "wipe" while a plan runs, else ""
	id      string // install_id of the running plan
	out     chan<- *nodev1.AgentMessage
	done    <-chan struct{} // closed when out's session ends
	pending []*nodev1.Progress
	wg      sync.WaitGroup
}

// attach routes progress to a session's send queue (drained until done
// closes), first the progress kept while no session was open.
func (j *jobs) attach(out chan<- *nodev1.AgentMessage, done <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.out, j.done = out, done
	pending := j.pending
	j.pending = nil
	for _, p := range pending {
		j.sendLocked(p)
	}
}

// detach stops routing progress to the ended session.
func (j *jobs) detach() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.out, j.done = nil, nil
}

// progress sends p on the open session or keeps it for the next one.
func (j *jobs) progress(p *nodev1.Progress) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.sendLocked(p)
}

func (j *jobs) sendLocked(p *nodev1.Progress) {
	if j.out != nil {
		select {
		case j.out <- &nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Progress{Progress: p}}:
			return
		case <-j.done:
		}
	}
	if len(j.pending) == maxPending {
		j.pending = j.pending[1:]
	}
	j.pending = append(j.pending, p)
}

// start runs fn in a goroutine unless a plan is running: then a plan
// with the same install_id is ignored (the appliance resent it) and
// another is answered with an error Progress (done = true).
func (j *jobs) start(ctx context.Context, kind, id string, fn func(context.Context, func(*nodev1.Progress)) error) {
	j.mu.Lock()
	if j.kind != "" {
		runningKind, runningID := j.kind, j.id
		j.mu.Unlock()
		if runningKind == kind && runningID == id {
			fmt.Fprintf(j.cfg.Console, "corral: %s plan %s is already running\n", kind, id)
			j.cfg.Logger.Info("plan already running", "kind", kind, "install", id)
			return
		}
		err := fmt.Sprintf("busy: %s plan %s is still running", runningKind, runningID)
		fmt.Fprintf(j.cfg.Console, "corral: refused %s plan %s: %s\n", kind, id, err)
		j.progress(&nodev1.Progress{Step: kind, Error: err, Done: true, InstallId: id})
		return
	}
	j.kind, j.id = kind, id
	j.wg.Add(1)
	j.mu.Unlock()
	go func() {
		defer j.wg.Done()
		report := func(p *nodev1.Progress) {
			switch {
			case p.GetError() != "":
				fmt.Fprintf(j.cfg.Console, "corral: %s %s failed at %s: %s\n", kind, id, p.GetStep(), p.GetError())
			case p.GetDetail() != "":
				fmt.Fprintf(j.cfg.Console, "corral: %s %s: %s: %s\n", kind, id, p.GetStep(), p.GetDetail())
			default:
				fmt.Fprintf(j.cfg.Console, "corral: %s %s: %s\n", kind, id, p.GetStep())
			}
			j.progress(p)
		}
		err := fn(ctx, report)
		if err != nil {
			j.cfg.Logger.Warn("plan failed", "kind", kind, "install", id, "err", err)
		} else {
			j.cfg.Logger.Info("plan done", "kind", kind, "install", id)
		}
		if err == nil && kind == "install" && j.cfg.InstallReboot > 0 {
			// Still busy: no other plan starts on a machine about to reboot.
			j.reboot(ctx, id)
		}
		j.mu.Lock()
		j.kind, j.id = "", ""
		j.mu.Unlock()
	}()
}

// reboot restarts the machine InstallReboot after install id finished,
// unless ctx ends first. A failed reboot is printed and reported.
func (j *jobs) reboot(ctx context.Context, id string) {
	fmt.Fprintf(j.cfg.Console, "corral: install %s done; rebooting into the hypervisor in %v\n", id, j.cfg.InstallReboot)
	select {
	case <-ctx.Done():
		return
	case <-time.After(j.cfg.InstallReboot):
	}
	j.cfg.Logger.Info("rebooting after install", "install", id)
	if err := j.cfg.Power.Reboot(); err != nil {
		fmt.Fprintf(j.cfg.Console, "corral: reboot after install %s: %v\n", id, err)
		j.progress(&nodev1.Progress{Step: "reboot", Error: err.Error(), InstallId: id})
	}
}

// wait blocks until the running plan (if any) returns.
func (j *jobs) wait() { j.wg.Wait() }
