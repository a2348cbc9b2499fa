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

// jobs runs install, wipe, deploy and erase plans one at a time, outside
// any one session: a plan keeps running when the stream breaks, and its
// progress goes to whichever session is open (kept, up to maxPending,
// while none is). Run owns it and waits for the running plan before
// returning. After a successful install it reboots the machine only when
// Config.InstallReboot is set; after a successful deploy, when its plan
// says reboot (rebootAfterDeploy).
type jobs struct {
	cfg *Config

	mu      sync.Mutex
	kind    string // "install", "wipe", "deploy" or "erase" while a plan runs, else ""
	id      string // install_id of the running plan
	out     chan<- *nodev1.AgentMessage
	done    <-chan struct{} // closed when out's session ends
	pending []*nodev1.Progress
	csr     *pendingCSR // the running install's unanswered certificate request
	// ended is closed when the running plan returns (nil while none runs);
	// installed is the install_id of the last install that succeeded.
	ended     chan struct{}
	installed string
	// reported is the install_id of the last install whose successful
	// "done" went to the progress queue (a KexecPlan of it arriving after
	// that is the appliance's go-ahead; before, a prefetch).
	reported string
	wg       sync.WaitGroup

	// awaited is a progress whose send on a session closes awaitSent (a
	// deploy's "written", which its reboot waits for). Under awaitMu, not
	// mu: the session's sender reports sends while sendLocked may hold mu
	// waiting for that sender.
	awaitMu   sync.Mutex
	awaited   *nodev1.Progress
	awaitSent chan struct{}
}

// pendingCSR is a certificate request waiting for its NodeCertificate.
type pendingCSR struct {
	id     string
	msg    *nodev1.AgentMessage
	answer chan *nodev1.NodeCertificate // buffered 1
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
	if j.csr != nil {
		// Unanswered on the session that ended (or not yet sent): the
		// appliance resends the plan on this one and answers here.
		j.sendMsgLocked(j.csr.msg)
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

// sendMsgLocked sends m on the open session, if any, and reports whether
// it went; a message that did not is not kept.
func (j *jobs) sendMsgLocked(m *nodev1.AgentMessage) bool {
	if j.out == nil {
		return false
	}
	select {
	case j.out <- m:
		return true
	case <-j.done:
		return false
	}
}

// certify sends the certificate request csrPEM for install id on the open
// session (and again on each session that opens while it waits) and waits
// for the NodeCertificate of that install: at most
// Config.CertificateTimeout, or until ctx ends. It returns the
// certificate PEM, or the appliance's refusal (ErrCertificateRefused).
// One request is outstanding at a time (plans run one at a time).
func (j *jobs) certify(ctx context.Context, id string, csrPEM []byte) ([]byte, error) {
	p := &pendingCSR{
		id:     id,
		msg:    &nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Csr{Csr: &nodev1.CertificateRequest{InstallId: id, CsrPem: string(csrPEM)}}},
		answer: make(chan *nodev1.NodeCertificate, 1),
	}
	j.mu.Lock()
	j.csr = p
	sent := j.sendMsgLocked(p.msg)
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		if j.csr == p {
			j.csr = nil
		}
		j.mu.Unlock()
	}()
	when := "sent"
	if !sent {
		when = "goes with the next session"
	}
	fmt.Fprintf(j.cfg.Console, "corral: install %s: node key made on this machine; its certificate request %s to the appliance\n", id, when)
	j.cfg.Logger.Info("certificate request", "install", id, "sent", sent)
	t := time.NewTimer(j.cfg.CertificateTimeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, fmt.Errorf("no answer from the appliance to the certificate request within %s", j.cfg.CertificateTimeout)
	case c := <-p.answer:
		if c.GetError() != "" {
			return nil, fmt.Errorf("%w: %s", ErrCertificateRefused, c.GetError())
		}
		return []byte(c.GetCertPem()), nil
	}
}

// answer hands a NodeCertificate to the request of its install id; it
// reports false when no such request waits (late, or another install's).
func (j *jobs) answer(c *nodev1.NodeCertificate) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.csr == nil || j.csr.id != c.GetInstallId() {
		return false
	}
	select {
	case j.csr.answer <- c:
	default: // already answered: the first answer counts
	}
	return true
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
	ended := make(chan struct{})
	j.ended = ended
	j.wg.Add(1)
	j.mu.Unlock()
	go func() {
		defer j.wg.Done()
		report := func(p *nodev1.Progress) {
			if kind == "install" && p.GetDone() && p.GetError() == "" {
				j.mu.Lock()
				j.reported = id
				j.mu.Unlock()
			}
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
		if err == nil && kind == "install" {
			j.mu.Lock()
			j.installed = id
			j.mu.Unlock()
			if j.cfg.InstallReboot > 0 {
				// Still busy: no other plan starts on a machine about to reboot.
				j.reboot(ctx, id)
			}
		}
		j.mu.Lock()
		j.kind, j.id, j.ended = "", "", nil
		j.mu.Unlock()
		if pf, ok := j.cfg.Kexec.(KexecPrefetcher); ok && kind == "install" && err != nil {
			// A kexec prefetched for this install is of no use. After the
			// reset above: a prefetch that is loaded only later sees the
			// install ended and discards itself (prefetch).
			pf.Discard(id)
		}
		close(ended)
	}()
}

// kexecWait bounds how long a KexecPlan waits for the install it follows
// to return (its "done" is sent just before).
const kexecWait = 30 * time.Second

// kexec carries out plan with k in the background, as a plan of its own
// (no other plan starts meanwhile): after plan's install, when it is still
// running (its "done" is sent just before it returns), has returned, and
// only when
// plan's install is the last install that succeeded on this machine. A
// refusal or a failure is reported as Progress{step: "kexec", done: true,
// error}; success does not return (the machine reboots into the
// hypervisor image).
func (j *jobs) kexec(ctx context.Context, plan *nodev1.KexecPlan, k Kexec) {
	id := plan.GetInstallId()
	if pf, ok := k.(KexecPrefetcher); ok && j.prefetchable(id) {
		j.prefetch(ctx, plan, pf)
		return
	}
	fail := func(err error) {
		fmt.Fprintf(j.cfg.Console, "corral: kexec after install %s refused or failed: %v\n", id, err)
		j.cfg.Logger.Warn("kexec failed", "install", id, "err", err)
		j.progress(&nodev1.Progress{Step: "kexec", Error: err.Error(), Done: true, InstallId: id})
	}
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		j.mu.Lock()
		var ended chan struct{}
		if j.kind == "install" && j.id == id {
			ended = j.ended // the install's return follows its "done"
		}
		j.mu.Unlock()
		if ended != nil {
			t := time.NewTimer(kexecWait)
			defer t.Stop()
			select {
			case <-ended:
			case <-ctx.Done():
				return
			case <-t.C:
				fail(fmt.Errorf("busy: a plan is still running after %s", kexecWait))
				return
			}
		}
		j.mu.Lock()
		switch {
		case j.kind == "kexec" && j.id == id:
			j.mu.Unlock()
			fmt.Fprintf(j.cfg.Console, "corral: the kexec after install %s is already under way\n", id)
			return
		case j.kind != "":
			runningKind, runningID := j.kind, j.id
			j.mu.Unlock()
			fail(fmt.Errorf("busy: %s plan %s is running", runningKind, runningID))
			return
		case id == "" || j.installed != id:
			last := j.installed
			j.mu.Unlock()
			fail(fmt.Errorf("install %s did not succeed on this machine (last successful install: %q)", id, last))
			return
		}
		j.kind, j.id = "kexec", id
		j.mu.Unlock()
		defer func() {
			j.mu.Lock()
			j.kind, j.id = "", ""
			j.mu.Unlock()
		}()
		fmt.Fprintf(j.cfg.Console, "corral: install %s done; booting the hypervisor image with kexec\n", id)
		if err := k.Kexec(ctx, plan); err != nil {
			fail(err)
		}
	}()
}

// prefetchable reports whether a KexecPlan of install id comes ahead of
// its reboot: id is the install running now and its successful "done"
// has not gone out yet.
func (j *jobs) prefetchable(id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return id != "" && j.kind == "install" && j.id == id && j.reported != id
}

// prefetch has pf fetch, verify and load plan in the background while its
// install runs; the plan the appliance sends after the install's done
// reboots into it (or, when this failed, fetches again and reports). A
// failure here is only printed and logged: the install has not
// succeeded yet, so the appliance would not act on it.
func (j *jobs) prefetch(ctx context.Context, plan *nodev1.KexecPlan, pf KexecPrefetcher) {
	id := plan.GetInstallId()
	fmt.Fprintf(j.cfg.Console, "corral: install %s running: fetching and loading the hypervisor image meanwhile\n", id)
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		start := time.Now()
		if err := pf.Prefetch(ctx, plan); err != nil {
			fmt.Fprintf(j.cfg.Console, "corral: kexec prefetch for install %s failed: %v (the kexec after the install fetches again)\n", id, err)
			j.cfg.Logger.Warn("kexec prefetch failed", "install", id, "err", err)
			return
		}
		j.cfg.Logger.Info("kexec prefetched", "install", id, "duration", time.Since(start).String())
		j.mu.Lock()
		failed := !(j.kind == "install" && j.id == id) && j.installed != id
		j.mu.Unlock()
		if failed {
			pf.Discard(id) // the install ended without success meanwhile
		}
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

// await marks p, before it is queued, as the progress whose send
// rebootAfterDeploy waits for.
func (j *jobs) await(p *nodev1.Progress) {
	j.awaitMu.Lock()
	defer j.awaitMu.Unlock()
	j.awaited, j.awaitSent = p, make(chan struct{})
}

// sent is told of every message a session's stream accepted.
func (j *jobs) sent(m *nodev1.AgentMessage) {
	p := m.GetProgress()
	if p == nil {
		return
	}
	j.awaitMu.Lock()
	defer j.awaitMu.Unlock()
	if p == j.awaited {
		close(j.awaitSent)
		j.awaited = nil
	}
}

// rebootAfterDeploy reboots the machine into its disk once deployment
// id's "written" progress went out on a session (Config.DeployRebootDelay
// after), or Config.DeployRebootGrace after the deploy when no session
// carried it, unless ctx ends first. A failed reboot is printed and
// reported.
func (j *jobs) rebootAfterDeploy(ctx context.Context, id string, written *nodev1.Progress) {
	var sent chan struct{} // nil: no "written" to wait for
	if written != nil {
		j.awaitMu.Lock()
		sent = j.awaitSent // closed once written went out
		j.awaitMu.Unlock()
	}
	grace := time.NewTimer(j.cfg.DeployRebootGrace)
	defer grace.Stop()
	select {
	case <-ctx.Done():
		return
	case <-sent:
		fmt.Fprintf(j.cfg.Console, "corral: deploy %s written; rebooting into the disk\n", id)
		select {
		case <-ctx.Done():
			return
		case <-time.After(j.cfg.DeployRebootDelay):
		}
	case <-grace.C:
		fmt.Fprintf(j.cfg.Console, "corral: deploy %s written; no session carried it within %s: rebooting into the disk anyway\n", id, j.cfg.DeployRebootGrace)
	}
	j.cfg.Logger.Info("rebooting after deploy", "deployment", id)
	if err := j.cfg.Power.Reboot(); err != nil {
		fmt.Fprintf(j.cfg.Console, "corral: reboot after deploy %s: %v\n", id, err)
		j.progress(&nodev1.Progress{Step: "reboot", Error: err.Error(), InstallId: id})
	}
}

// wait blocks until the running plan (if any) returns.
func (j *jobs) wait() { j.wg.Wait() }
