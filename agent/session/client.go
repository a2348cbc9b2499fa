package session

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/corralhq/corral/agent/cmdline"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// Power carries out the appliance's power commands. PowerOff and Reboot
// normally do not return on success.
type Power interface {
	PowerOff() error
	Reboot() error
}

// Installer carries out the appliance's install and wipe plans
// (agent/install). Each call blocks until the plan is finished; it reports
// every step through progress, the last one with done = true (also on
// failure, with the error), and returns the error. Install makes the node
// key on the machine and calls sign with its certificate request: sign
// sends it on the session for the plan's install id and returns the
// certificate the appliance signed (or its refusal, or the end of the
// wait: Config.CertificateTimeout, ctx).
type Installer interface {
	Install(ctx context.Context, plan *nodev1.InstallPlan, sign func(ctx context.Context, csrPEM []byte) ([]byte, error), progress func(*nodev1.Progress)) error
	Wipe(ctx context.Context, plan *nodev1.WipePlan, progress func(*nodev1.Progress)) error
}

// Deployer carries out the appliance's deploy plans (agent/deploy): it
// writes an operating system onto the machine's disk. Deploy blocks until
// the disk is written or a step failed; it reports every step through
// progress, the last one with done = true ("written", or the failing
// step with the error), and returns the error.
type Deployer interface {
	Deploy(ctx context.Context, plan *nodev1.DeployPlan, progress func(*nodev1.Progress)) error
}

// Eraser carries out the appliance's erase plans (agent/erase). Erase
// blocks until the disks are erased or a step failed, reporting like
// Deployer.Deploy (the last progress "erased", done).
type Eraser interface {
	Erase(ctx context.Context, plan *nodev1.ErasePlan, progress func(*nodev1.Progress)) error
}

// Commissioner carries out the appliance's commissioning plans
// (agent/commission), reporting each test's result and last
// Progress{step: "commissioned", done: true}.
type Commissioner interface {
	Commission(ctx context.Context, plan *nodev1.CommissionPlan, progress func(*nodev1.Progress)) error
}

// Kexec boots the hypervisor image straight from the discovery image
// after a successful install (agent/kexec). Kexec blocks; it does not
// return when the machine reboots into the image, and returns the error
// of the step that failed otherwise, with nothing left loaded.
type Kexec interface {
	Kexec(ctx context.Context, plan *nodev1.KexecPlan) error
}

// KexecPrefetcher is a Kexec that can do the work of a plan ahead of its
// reboot (agent/kexec's Booter): an agent whose Kexec is one names the
// "kexec-prefetch" capability, and a KexecPlan that arrives while the
// install it follows still runs (before its "done" went out) is
// prefetched; the plan the appliance sends after the done then reboots.
type KexecPrefetcher interface {
	Kexec
	// Prefetch fetches, verifies and loads plan without rebooting; it
	// blocks until they are loaded or a step failed (nothing loaded).
	Prefetch(ctx context.Context, plan *nodev1.KexecPlan) error
	// Discard drops what a Prefetch of install id loaded (or cancels it
	// and waits for it): that install failed.
	Discard(id string)
}

// ErrCertificateRefused means the appliance answered the install's certificate
// request with an error (its reason follows in the message).
var ErrCertificateRefused = errors.New("the appliance refused the certificate request")

// DefaultCertificateTimeout bounds the wait for the appliance's answer to
// an install's certificate request.
const DefaultCertificateTimeout = 60 * time.Second

// Config configures a Client. Endpoints, Token, CAFingerprint, BootMAC,
// Facts and Power are required.
type Config struct {
	// Endpoints are the appliances' API host:port in the order to try
	// them (corral.endpoint: the appliance that rendered the boot script
	// first). The per-boot token and the CA are the fleet's, so any of
	// them serves the agent.
	Endpoints     []string
	Token         string // per-boot bearer token
	CAFingerprint string // lowercase hex SHA-256 of the CA certificate (DER)
	// ExtraCAs are candidate CA certificates besides the chain the server
	// sends; only one matching CAFingerprint is trusted.
	ExtraCAs     []*x509.Certificate
	BootMAC      string
	AgentVersion string
	// Facts returns the facts to register; it is called before each
	// Register attempt.
	Facts func(ctx context.Context) *inventoryv1.Facts
	Power Power
	// Installer carries out install and wipe plans, one at a time, while
	// the session keeps heartbeating; nil answers them as unsupported.
	Installer Installer
	// InstallReboot, when positive, makes the agent reboot itself that
	// long after a successful install's "done". Zero: it does not (the
	// appliance reboots the machine when it has recorded "done" and
	// switched the boot intent: BMC power cycle or the Reboot command).
	InstallReboot time.Duration
	// Kexec, when set (and InstallReboot is not), is advertised to the
	// appliance (the "kexec" capability) and carries out its KexecPlan
	// after a successful install: the hypervisor image without a firmware
	// reboot. A plan for any other install than the last one that
	// succeeded here is refused.
	Kexec Kexec
	// Deployer carries out deploy plans and Eraser erase plans, as jobs
	// like installs (one plan at a time, across sessions); nil answers
	// them as unsupported.
	Deployer Deployer
	Eraser   Eraser
	// Commissioner carries out commissioning plans, as a job like the
	// others; nil answers them as unsupported.
	Commissioner Commissioner
	// DeployRebootGrace bounds the wait, after a successful deploy whose
	// plan says reboot, for its "written" progress to go out on a session
	// (none may be open); the machine reboots then anyway (default 10 s).
	// DeployRebootDelay is the pause between that send and the reboot,
	// for the message to leave the machine (default 1 s).
	DeployRebootGrace time.Duration
	DeployRebootDelay time.Duration
	// TPM, when set, proves at every Register that the machine holds its
	// TPM's endorsement key (attest.go); nil registers without a proof,
	// as a machine without a TPM does.
	TPM TPM
	// Console receives one human line per failed attempt and per command;
	// nil discards.
	Console io.Writer
	Logger  *slog.Logger
	// Heartbeat is the interval between heartbeats (default 10 s).
	Heartbeat time.Duration
	// RPCTimeout bounds Register and each send (default 30 s).
	RPCTimeout time.Duration
	// Keepalive is the interval of the transport pings that find an
	// appliance gone silent during a session (its host died, the network
	// dropped it): unanswered for KeepaliveTimeout, the session ends and
	// the agent registers with the next endpoint. Defaults 20 s and 10 s;
	// gRPC pings no more often than every 10 s, and the appliance closes
	// a connection pinging more often than its --grpc-keepalive-min-time.
	Keepalive        time.Duration
	KeepaliveTimeout time.Duration
	// CertificateTimeout bounds an install's wait for the NodeCertificate
	// answering its certificate request (default
	// DefaultCertificateTimeout); the request is sent again on every
	// session that opens meanwhile.
	CertificateTimeout time.Duration
	Backoff            Backoff
	// DialOptions are appended to the client's own (tests).
	DialOptions []grpc.DialOption
}

func (c *Config) validate() error {
	switch {
	case len(c.Endpoints) == 0:
		return errors.New("session: an endpoint is required")
	case len(c.Endpoints) > cmdline.MaxEndpoints:
		return fmt.Errorf("session: %d endpoints, at most %d", len(c.Endpoints), cmdline.MaxEndpoints)
	case c.Token == "":
		return errors.New("session: token is required")
	case len(c.CAFingerprint) != 64:
		return errors.New("session: CA fingerprint must be 64 hex digits")
	case c.BootMAC == "":
		return errors.New("session: boot MAC is required")
	case c.Facts == nil:
		return errors.New("session: Facts is required")
	case c.Power == nil:
		return errors.New("session: Power is required")
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 10 * time.Second
	}
	for i, e := range c.Endpoints {
		if err := cmdline.CheckEndpoint(e); err != nil {
			return fmt.Errorf("session: endpoint %d: %w", i+1, err)
		}
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = 30 * time.Second
	}
	if c.Keepalive <= 0 {
		c.Keepalive = 20 * time.Second
	}
	if c.KeepaliveTimeout <= 0 {
		c.KeepaliveTimeout = 10 * time.Second
	}
	if c.DeployRebootGrace <= 0 {
		c.DeployRebootGrace = 10 * time.Second
	}
	if c.DeployRebootDelay <= 0 {
		c.DeployRebootDelay = time.Second
	}
	if c.CertificateTimeout <= 0 {
		c.CertificateTimeout = DefaultCertificateTimeout
	}
	if c.Console == nil {
		c.Console = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// bearer sends the per-boot token; it refuses plaintext transports.
type bearer string

func (t bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// Run registers and keeps a session open until ctx ends, and returns nil
// then. It registers with Config.Endpoints in order; when Register fails
// (dial, TLS, refusal, no answer within RPCTimeout) or the session ends
// (the stream broke, the appliance closed it, or its transport went
// silent past the keepalive), it moves to the next endpoint, wrapping
// around. Failures follow each other without a pause while some endpoint
// of the round is untried; after a whole round failed it waits
// Config.Backoff (growing with each failed round, reset by a
// registration), and after a session it waits Backoff's first delay.
// Every failure is printed on the console with the endpoint and the
// attempt number. Run never gives up on its own; it returns an error only
// for an invalid Config. Install and wipe plans keep running across
// sessions, and their progress goes to whichever appliance the agent is
// on.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	creds := credentials.NewTLS(PinnedTLS(cfg.CAFingerprint, cfg.ExtraCAs))
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(bearer(cfg.Token)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: cfg.Keepalive, Timeout: cfg.KeepaliveTimeout}),
	}, cfg.DialOptions...)
	jobs := &jobs{cfg: &cfg}
	defer jobs.wait()

	n := len(cfg.Endpoints)
	var (
		i       int // the endpoint to try next
		attempt int // failed Registers since the last registration
		failed  int // endpoints failed in this round
		round   int // whole rounds failed since the last registration
	)
	for {
		ep := cfg.Endpoints[i]
		next := cfg.Endpoints[(i+1)%n]
		i = (i + 1) % n
		reg, sessErr, err := visit(ctx, &cfg, ep, opts, jobs)
		if ctx.Err() != nil {
			return nil
		}
		var d time.Duration
		if err == nil {
			attempt, failed, round = 0, 0, 0
			fmt.Fprintf(cfg.Console, "corral: session with %s ended: %v; registering with %s\n", ep, reason(sessErr), next)
			cfg.Logger.Warn("session ended", "appliance", ep, "machine", reg.GetMachineName(), "next", next, "err", sessErr)
			d = cfg.Backoff.Delay(0)
		} else {
			attempt++
			failed++
			fmt.Fprintf(cfg.Console, "corral: register with %s failed (attempt %d): %s\n", ep, attempt, reason(err))
			cfg.Logger.Warn("register failed", "appliance", ep, "attempt", attempt, "err", err)
			if failed < n {
				continue // another appliance of this round first
			}
			d = cfg.Backoff.Delay(round)
			failed = 0
			round++
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
}

// visit dials ep, registers and, when that worked, keeps the session
// until it ends. err is Register's failure; sessErr why the session
// ended.
func visit(ctx context.Context, cfg *Config, ep string, opts []grpc.DialOption, jobs *jobs) (reg *nodev1.RegisterResponse, sessErr, err error) {
	conn, err := grpc.NewClient(ep, opts...)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	client := nodev1.NewAgentServiceClient(conn)
	reg, err = register(ctx, cfg, client)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(cfg.Console, "corral: registered as %s with %s\n", reg.GetMachineName(), ep)
	cfg.Logger.Info("registered", "machine", reg.GetMachineName(), "session", reg.GetSessionId(), "appliance", ep)
	return reg, runSession(ctx, cfg, client, reg, jobs), nil
}

// reason renders an RPC error for a person at a console.
func reason(err error) string {
	if s, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s: %s", s.Code(), s.Message())
	}
	return err.Error()
}

func register(ctx context.Context, cfg *Config, client nodev1.AgentServiceClient) (*nodev1.RegisterResponse, error) {
	proof, err := proveTPM(ctx, cfg, client)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.RPCTimeout)
	defer cancel()
	return client.Register(ctx, &nodev1.RegisterRequest{
		BootMac:      cfg.BootMAC,
		Facts:        cfg.Facts(ctx),
		AgentVersion: cfg.AgentVersion,
		Capabilities: cfg.capabilities(),
		Tpm:          proof,
	})
}

// capabilities are the optional commands this agent carries out: kexec
// when it has a Kexec and does not reboot by itself after an install,
// and kexec-prefetch when that Kexec is a KexecPrefetcher.
func (c *Config) capabilities() []string {
	if c.Kexec == nil || c.InstallReboot > 0 {
		return nil
	}
	if _, ok := c.Kexec.(KexecPrefetcher); ok {
		return []string{nodev1.CapabilityKexec, nodev1.CapabilityKexecPrefetch}
	}
	return []string{nodev1.CapabilityKexec}
}

// runSession keeps one Session stream: a heartbeat at once and every
// cfg.Heartbeat, commands obeyed as they come. It returns when the stream
// fails or ctx ends.
func runSession(ctx context.Context, cfg *Config, client nodev1.AgentServiceClient, reg *nodev1.RegisterResponse, jobs *jobs) error {
	runCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Session(ctx)
	if err != nil {
		return err
	}
	sendErr := make(chan error, 1)
	out := make(chan *nodev1.AgentMessage, 4)
	senderDone := make(chan struct{})
	defer func() { cancel(); <-senderDone; jobs.detach() }()
	// The sender owns stream.Send; it stops when ctx ends.
	go func() {
		defer close(senderDone)
		beat := &nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: reg.GetSessionId()}}}
		t := time.NewTicker(cfg.Heartbeat)
		defer t.Stop()
		send := func(m *nodev1.AgentMessage) bool {
			if err := stream.Send(m); err != nil {
				sendErr <- err
				cancel()
				return false
			}
			return true
		}
		if !send(beat) {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-out:
				if !send(m) {
					return
				}
				jobs.sent(m)
			case <-t.C:
				if !send(beat) {
					return
				}
			}
		}
	}()
	jobs.attach(out, ctx.Done())
	for {
		msg, err := stream.Recv()
		if err != nil {
			select {
			case serr := <-sendErr:
				return serr
			default:
			}
			if err == io.EOF {
				return errors.New("appliance closed the session")
			}
			return err
		}
		obey(ctx, runCtx, cfg, msg, out, jobs)
	}
}

// obey carries out one command. Plans run as jobs under runCtx (Run's),
// so they outlive this session's stream.
func obey(ctx, runCtx context.Context, cfg *Config, msg *nodev1.ApplianceMessage, out chan<- *nodev1.AgentMessage, jobs *jobs) {
	progress := func(p *nodev1.Progress) {
		select {
		case out <- &nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Progress{Progress: p}}:
		case <-ctx.Done():
		}
	}
	switch cmd := msg.GetCmd().(type) {
	case *nodev1.ApplianceMessage_Wait_:
		cfg.Logger.Info("command", "cmd", "wait")
	case *nodev1.ApplianceMessage_PowerOff_:
		fmt.Fprintln(cfg.Console, "corral: appliance asked to power off")
		progress(&nodev1.Progress{Step: "power_off", Detail: "powering off"})
		if err := cfg.Power.PowerOff(); err != nil {
			progress(&nodev1.Progress{Step: "power_off", Error: err.Error()})
		}
	case *nodev1.ApplianceMessage_Reboot_:
		fmt.Fprintln(cfg.Console, "corral: appliance asked to reboot")
		progress(&nodev1.Progress{Step: "reboot", Detail: "rebooting"})
		if err := cfg.Power.Reboot(); err != nil {
			progress(&nodev1.Progress{Step: "reboot", Error: err.Error()})
		}
	case *nodev1.ApplianceMessage_Install:
		plan := cmd.Install
		if cfg.Installer == nil {
			fmt.Fprintln(cfg.Console, "corral: appliance sent an install plan; not supported by this agent yet")
			progress(&nodev1.Progress{Step: "install", Done: true, Error: "not supported by this agent yet", InstallId: plan.GetInstallId()})
			return
		}
		disk := plan.GetDisk()
		if disk == "" {
			disk = "auto"
		}
		fmt.Fprintf(cfg.Console, "corral: appliance sent install plan %s: node %s, disk %s, wipe %v (fields: %s)\n",
			plan.GetInstallId(), plan.GetHostname(), disk, plan.GetWipe(), planFields(plan))
		if err := planCAPinned(plan, cfg.CAFingerprint); err != nil {
			fmt.Fprintln(cfg.Console, "corral: install plan refused:", err)
			progress(&nodev1.Progress{Step: "install", Done: true, Error: err.Error(), InstallId: plan.GetInstallId()})
			return
		}
		id := plan.GetInstallId()
		jobs.start(runCtx, "install", id, func(ctx context.Context, progress func(*nodev1.Progress)) error {
			sign := func(ctx context.Context, csrPEM []byte) ([]byte, error) { return jobs.certify(ctx, id, csrPEM) }
			return cfg.Installer.Install(ctx, plan, sign, progress)
		})
	case *nodev1.ApplianceMessage_Kexec:
		plan := cmd.Kexec
		if cfg.capabilities() == nil {
			fmt.Fprintln(cfg.Console, "corral: appliance sent a kexec plan; this agent does not kexec")
			progress(&nodev1.Progress{Step: "kexec", Done: true, Error: "kexec not supported by this agent", InstallId: plan.GetInstallId()})
			return
		}
		fmt.Fprintf(cfg.Console, "corral: appliance sent kexec plan for install %s: %s + %s\n", plan.GetInstallId(), plan.GetKernelUrl(), plan.GetInitrdUrl())
		jobs.kexec(runCtx, plan, cfg.Kexec)
	case *nodev1.ApplianceMessage_Certificate:
		c := cmd.Certificate
		if !jobs.answer(c) {
			cfg.Logger.Warn("node certificate for no pending request ignored", "install", c.GetInstallId())
		}
	case *nodev1.ApplianceMessage_Wipe:
		plan := cmd.Wipe
		if cfg.Installer == nil {
			fmt.Fprintln(cfg.Console, "corral: appliance sent a wipe plan; not supported by this agent yet")
			progress(&nodev1.Progress{Step: "wipe", Done: true, Error: "not supported by this agent yet", InstallId: plan.GetInstallId()})
			return
		}
		fmt.Fprintf(cfg.Console, "corral: appliance sent wipe plan %s: disk %s\n", plan.GetInstallId(), plan.GetDisk())
		jobs.start(runCtx, "wipe", plan.GetInstallId(), func(ctx context.Context, progress func(*nodev1.Progress)) error {
			return cfg.Installer.Wipe(ctx, plan, progress)
		})
	case *nodev1.ApplianceMessage_Deploy:
		plan := cmd.Deploy
		id := plan.GetDeploymentId()
		if cfg.Deployer == nil {
			fmt.Fprintln(cfg.Console, "corral: appliance sent a deploy plan; not supported by this agent yet")
			progress(&nodev1.Progress{Step: "deploy", Done: true, Error: "not supported by this agent yet", InstallId: id})
			return
		}
		fmt.Fprintf(cfg.Console, "corral: appliance sent deploy plan %s: image %s (%d bytes), reboot %v\n", id, plan.GetImageSha256(), plan.GetImageSize(), plan.GetReboot())
		jobs.start(runCtx, "deploy", id, func(ctx context.Context, progress func(*nodev1.Progress)) error {
			var written *nodev1.Progress
			err := cfg.Deployer.Deploy(ctx, plan, func(p *nodev1.Progress) {
				if p.GetDone() && p.GetError() == "" {
					written = p
					jobs.await(p) // before it is queued: its send is what the reboot waits for
				}
				progress(p)
			})
			if err == nil && plan.GetReboot() {
				// Still busy: no other plan starts on a machine about to reboot.
				jobs.rebootAfterDeploy(ctx, id, written)
			}
			return err
		})
	case *nodev1.ApplianceMessage_Erase:
		plan := cmd.Erase
		id := plan.GetEraseId()
		if cfg.Eraser == nil {
			fmt.Fprintln(cfg.Console, "corral: appliance sent an erase plan; not supported by this agent yet")
			progress(&nodev1.Progress{Step: "erase", Done: true, Error: "not supported by this agent yet", InstallId: id})
			return
		}
		fmt.Fprintf(cfg.Console, "corral: appliance sent erase plan %s: level %s, disks %s\n", id, plan.GetLevel(), strings.Join(plan.GetDisks(), " "))
		jobs.start(runCtx, "erase", id, func(ctx context.Context, progress func(*nodev1.Progress)) error {
			return cfg.Eraser.Erase(ctx, plan, progress)
		})
	case *nodev1.ApplianceMessage_Commission:
		plan := cmd.Commission
		id := plan.GetCommissionId()
		if cfg.Commissioner == nil {
			fmt.Fprintln(cfg.Console, "corral: appliance sent a commissioning plan; not supported by this agent yet")
			progress(&nodev1.Progress{Step: "commissioned", Done: true, Error: "not supported by this agent yet", InstallId: id})
			return
		}
		fmt.Fprintf(cfg.Console, "corral: appliance sent commissioning plan %s: profile %s, %d steps\n", id, plan.GetProfile(), len(plan.GetSteps()))
		jobs.start(runCtx, "commission", id, func(ctx context.Context, progress func(*nodev1.Progress)) error {
			return cfg.Commissioner.Commission(ctx, plan, progress)
		})
	default:
		cfg.Logger.Warn("unknown command", "cmd", fmt.Sprintf("%T", cmd))
	}
}

// planFields names the fields an install plan arrived with, in field
// order, and any field this agent does not know as "unknown field N": the
// console shows what the appliance sent (no key material: the node key is
// made here).
func planFields(plan *nodev1.InstallPlan) string {
	var names []string
	m := plan.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); m.Has(fd) {
			names = append(names, string(fd.Name()))
		}
	}
	for b := m.GetUnknown(); len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			names = append(names, "malformed unknown fields")
			break
		}
		b = b[n:]
		names = append(names, fmt.Sprintf("unknown field %d", num))
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			break
		}
		b = b[n:]
	}
	return strings.Join(names, " ")
}

// planCAPinned checks that the CA an install plan asks the node to trust is
// the CA pinned on the kernel command line: the node's identity must chain
// to the appliance this agent verified, not to whatever the plan names.
func planCAPinned(plan *nodev1.InstallPlan, fingerprint string) error {
	block, _ := pem.Decode([]byte(plan.GetCaCertPem()))
	if block == nil || block.Type != "CERTIFICATE" {
		return errors.New("install plan: ca_cert_pem holds no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("install plan: ca_cert_pem: %w", err)
	}
	if fp := Fingerprint(cert); fp != strings.ToLower(fingerprint) {
		return fmt.Errorf("install plan: its CA (sha256 %s) is not the CA pinned on the kernel command line (sha256 %s)", fp, strings.ToLower(fingerprint))
	}
	return nil
}
