package ipmi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	"github.com/bmc-toolbox/bmclib/v2/bmc"
	"github.com/bmc-toolbox/bmclib/v2/providers/ipmitool"
	"github.com/bmc-toolbox/bmclib/v2/providers/redfish"
	"github.com/jacobweinstock/registrar"
)

// Provider names as recorded in Answer.
const (
	IpmitoolProviderName = ipmitool.ProviderName // "ipmitool"
	RedfishProviderName  = redfish.ProviderName  // "gofish"
)

// Config configures a Controller. Zero values take the defaults.
type Config struct {
	Logger *slog.Logger
	// CallTimeout bounds a call whose Target has no Timeout (default 10s).
	CallTimeout time.Duration
	// Providers lists, in order, the providers to try; empty means
	// DefaultProviders. Names: NativeProviderName, IpmitoolProviderName,
	// RedfishProviderName. Providers that do not speak the target's
	// protocol are skipped.
	Providers []string
	// IpmitoolPath is the ipmitool binary for the ipmitool provider
	// (default: looked up in PATH; the provider is skipped without it).
	IpmitoolPath string
	// Observe, when set, is told every call's operation (e.g.
	// "power-state", "power-on"), the provider that answered ("none" when
	// none did), its outcome (Outcome) and how long it took, for corrald's
	// metrics. It must be quick and safe for concurrent use.
	Observe func(op, provider, outcome string, took time.Duration)
}

// Outcome names an error's class for metrics: "ok", "auth",
// "unreachable", "protocol", "failed", "invalid", "certificate" or
// "other".
func Outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrCertificate):
		return "certificate"
	case errors.Is(err, ErrAuth):
		return "auth"
	case errors.Is(err, ErrUnreachable):
		return "unreachable"
	case errors.Is(err, ErrProtocol):
		return "protocol"
	case errors.Is(err, ErrFailed):
		return "failed"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	}
	return "other"
}

// DefaultProviders lists the providers tried, in order: the native RMCP+
// provider first, bmclib's ipmitool provider as a fallback when the binary
// exists, then Redfish.
var DefaultProviders = []string{NativeProviderName, IpmitoolProviderName, RedfishProviderName}

// Controller performs BMC operations. It holds no per-BMC state: every
// call opens a session with the target, runs, and closes it. Safe for
// concurrent use.
type Controller struct {
	cfg Config
	log *slog.Logger
	// sdrs caches each BMC's sensor records for Health (health.go).
	sdrs sdrCache
}

// New returns a Controller.
func New(cfg Config) *Controller {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 10 * time.Second
	}
	if len(cfg.Providers) == 0 {
		cfg.Providers = DefaultProviders
	}
	if cfg.IpmitoolPath == "" {
		if p, err := exec.LookPath("ipmitool"); err == nil {
			cfg.IpmitoolPath = p
		}
	}
	return &Controller{cfg: cfg, log: cfg.Logger}
}

func speaks(provider string, p Protocol) bool {
	switch provider {
	case NativeProviderName, IpmitoolProviderName:
		return p != ProtocolRedfish
	case RedfishProviderName:
		return p != ProtocolIPMI
	}
	return false
}

// session is one bmclib client opened against a target.
type session struct {
	ctl      *Controller
	t        Target
	cl       *bmclib.Client
	answer   Answer
	perCall  time.Duration
	deadline time.Time
	// certs checks the Redfish provider's TLS handshakes and tr is its
	// transport (both nil when Redfish is not tried).
	certs *certCheck
	tr    *http.Transport
}

// open builds the provider registry for t and opens every provider
// concurrently; the ones that fail are recorded and dropped.
func (c *Controller) open(ctx context.Context, t Target) (*session, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	reg := registrar.NewRegistry()
	var names []string
	var skipped []Attempt
	var certs *certCheck
	var tr *http.Transport
	for _, name := range c.cfg.Providers {
		if !speaks(name, t.Protocol) {
			continue
		}
		switch name {
		case NativeProviderName:
			reg.Register(NativeProviderName, "ipmi", nativeFeatures, nil, newNativeProvider(t))
		case IpmitoolProviderName:
			if c.cfg.IpmitoolPath == "" {
				continue
			}
			port := t.PortFor(ProtocolIPMI)
			opts := []ipmitool.Option{ipmitool.WithPort(strconv.Itoa(port)), ipmitool.WithIpmitoolPath(c.cfg.IpmitoolPath)}
			if t.CipherSuite != 0 {
				opts = append(opts, ipmitool.WithCipherSuite(strconv.Itoa(t.CipherSuite)))
			}
			drv, err := ipmitool.New(t.Host, t.Username, t.Password, opts...)
			if err != nil {
				continue
			}
			reg.Register(ipmitool.ProviderName, ipmitool.ProviderProtocol, ipmitool.Features, nil, drv)
		case RedfishProviderName:
			if t.TLSMode == TLSPinned && t.TLSSHA256 == "" {
				// Fail closed: the password would go to whoever answers.
				skipped = append(skipped, Attempt{Provider: name, Err: "not tried: " + (&CertificateError{}).Error()})
				continue
			}
			port := t.PortFor(ProtocolRedfish)
			// Our own HTTP client, not bmclib's (which skips verification
			// altogether): gofish uses a given client as it is.
			certs = newCertCheck(t)
			var hc *http.Client
			hc, tr = certs.httpClient()
			opts := []redfish.Option{redfish.WithPort(strconv.Itoa(port)), redfish.WithHttpClient(hc)}
			reg.Register(redfish.ProviderName, redfish.ProviderProtocol, redfish.Features, nil,
				redfish.New(t.Host, t.Username, t.Password, bmclibLogger(c.log), opts...))
		default:
			return nil, fmt.Errorf("%w: unknown provider %q", ErrInvalid, name)
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		if len(skipped) > 0 {
			return &session{ctl: c, t: t, answer: Answer{Attempts: skipped}}, fmt.Errorf("%s: %w", t, &CertificateError{})
		}
		return nil, fmt.Errorf("%w: no provider speaks %s", ErrInvalid, t.Protocol)
	}
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = c.cfg.CallTimeout
	}
	s := &session{ctl: c, t: t, certs: certs, tr: tr, answer: Answer{Attempts: skipped}}
	s.deadline = time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(s.deadline) {
		s.deadline = d
	}
	// Providers open concurrently, each until the deadline; the calls
	// after Open run providers in order, each with an equal share of the
	// time left (share), so one that hangs cannot starve the next.
	s.cl = bmclib.NewClient(t.Host, t.Username, t.Password,
		bmclib.WithRegistry(reg),
		bmclib.WithLogger(bmclibLogger(c.log)),
		bmclib.WithPerProviderTimeout(time.Until(s.deadline)),
	)
	start := time.Now()
	err := s.cl.Open(ctx)
	s.share()
	md := s.cl.GetMetadata()
	for _, name := range names {
		if e, failed := md.FailedProviderDetail[name]; failed {
			s.answer.Attempts = append(s.answer.Attempts, Attempt{Provider: name, Err: "open: " + e, Took: time.Since(start)})
		}
	}
	if err != nil {
		return s, s.classify(ctx, err)
	}
	return s, nil
}

// share sets each remaining provider's timeout to an equal part of the
// time left.
func (s *session) share() {
	n := max(1, len(s.cl.Registry.Drivers))
	s.perCall = max(time.Millisecond, time.Until(s.deadline)/time.Duration(n))
	bmclib.WithPerProviderTimeout(s.perCall)(s.cl)
}

func (s *session) close() {
	if s.tr != nil {
		defer s.tr.CloseIdleConnections()
	}
	if s.cl == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.cl.Close(ctx)
}

// tls records in the answer the certificate the Redfish BMC presented.
func (s *session) tls() {
	if s.certs != nil {
		s.answer.TLSSHA256, _ = s.certs.result()
	}
}

// record appends an operation's metadata to the answer.
func (s *session) record(start time.Time) {
	md := s.cl.GetMetadata()
	for _, name := range md.ProvidersAttempted {
		at := Attempt{Provider: name, Took: time.Since(start)}
		if e, ok := md.FailedProviderDetail[name]; ok {
			at.Err = e
		}
		s.answer.Attempts = append(s.answer.Attempts, at)
	}
	if md.SuccessfulProvider != "" {
		s.answer.Provider = md.SuccessfulProvider
	}
}

// classify turns a bmclib error (which aggregates every provider's) into
// one wrapping this package's sentinels. The per-provider errors of our
// native provider carry them already; bmclib's providers are classified by
// what they report.
func (s *session) classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	// A refused certificate comes first: whatever else failed, the
	// operator must hear that the BMC is not the one enrolled. The
	// handshake check records it; the providers' error text would not
	// carry it reliably.
	if s.certs != nil {
		if _, refused := s.certs.result(); refused != nil {
			return fmt.Errorf("%s: %w", s.t, refused)
		}
	}
	detail := s.answer.String()
	switch {
	case errors.Is(err, ErrAuth), s.anyAttempt(isAuthText):
		return fmt.Errorf("%s: %w (%s)", s.t, ErrAuth, detail)
	case errors.Is(err, ErrInvalid):
		return fmt.Errorf("%s: %w (%s)", s.t, ErrInvalid, detail)
	case errors.Is(err, ErrFailed):
		return fmt.Errorf("%s: %w (%s)", s.t, ErrFailed, detail)
	case errors.Is(err, ErrProtocol):
		return fmt.Errorf("%s: %w (%s)", s.t, ErrProtocol, detail)
	case ctx.Err() != nil || time.Now().After(s.deadline) || errors.Is(err, context.DeadlineExceeded):
		cause := ctx.Err()
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		return fmt.Errorf("%s: %w: %w (%s)", s.t, ErrUnreachable, cause, detail)
	case errors.Is(err, ErrUnreachable), s.anyAttempt(isUnreachableText):
		return fmt.Errorf("%s: %w (%s)", s.t, ErrUnreachable, detail)
	}
	return fmt.Errorf("%s: %w (%s)", s.t, ErrProtocol, detail)
}

func (s *session) anyAttempt(f func(string) bool) bool {
	for _, a := range s.answer.Attempts {
		if a.Err != "" && f(a.Err) {
			return true
		}
	}
	return false
}

// isAuthText recognises bmclib providers' credential rejections: ipmitool
// prints "RAKP 2 HMAC is invalid" / "Unauthorized name" / "invalid
// password", Redfish answers 401. Our own provider's errors are typed.
func isAuthText(s string) bool {
	s = strings.ToLower(s)
	for _, k := range []string{"authentication failed", "rakp 2 hmac is invalid", "unauthorized name", "invalid password", "401", "unauthorized"} {
		if strings.Contains(s, k) {
			return true
		}
	}
	return false
}

func isUnreachableText(s string) bool {
	s = strings.ToLower(s)
	for _, k := range []string{"unreachable", "connection refused", "no route to host", "i/o timeout", "deadline exceeded", "unable to establish", "no such host"} {
		if strings.Contains(s, k) {
			return true
		}
	}
	return false
}

// do opens a session, runs f, closes the session, and classifies errors;
// Config.Observe hears of every call.
func (c *Controller) do(ctx context.Context, t Target, op string, f func(ctx context.Context, s *session) error) (Answer, error) {
	start := time.Now()
	a, err := c.call(ctx, t, op, f)
	if c.cfg.Observe != nil {
		c.cfg.Observe(op, cmp.Or(a.Provider, "none"), Outcome(err), time.Since(start))
	}
	return a, err
}

func (c *Controller) call(ctx context.Context, t Target, op string, f func(ctx context.Context, s *session) error) (Answer, error) {
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = c.cfg.CallTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	t = c.narrowAuto(ctx, t)
	s, err := c.open(ctx, t)
	if err != nil {
		var a Answer
		if s != nil {
			// Nothing opened, so nothing to log out of; only the
			// Redfish transport may hold a connection.
			if s.tr != nil {
				s.tr.CloseIdleConnections()
			}
			s.tls()
			a = s.answer
		}
		c.log.Debug("bmc call failed", "bmc", t.String(), "op", op, "err", err, "took", time.Since(start).String())
		return a, err
	}
	defer s.close()
	if err := f(ctx, s); err != nil {
		c.log.Debug("bmc call failed", "bmc", t.String(), "op", op, "err", err, "took", time.Since(start).String())
		err = s.classify(ctx, err)
		s.tls()
		return s.answer, err
	}
	s.tls()
	c.log.Debug("bmc call", "bmc", t.String(), "op", op, "provider", s.answer.Provider, "took", time.Since(start).String())
	return s.answer, nil
}

func (s *session) powerState(ctx context.Context) (PowerState, error) {
	s.share()
	start := time.Now()
	raw, err := s.cl.GetPowerState(ctx)
	s.record(start)
	if err != nil {
		return PowerUnknown, err
	}
	st := NormalizePowerState(raw)
	if st == PowerUnknown {
		return PowerUnknown, fmt.Errorf("%w: power state %q", ErrProtocol, strings.TrimSpace(raw))
	}
	return st, nil
}

// PowerState reads the power state. It blocks for at most the target's
// timeout; errors wrap ErrAuth, ErrUnreachable, ErrProtocol, ErrFailed or
// ErrInvalid.
func (c *Controller) PowerState(ctx context.Context, t Target) (PowerState, Answer, error) {
	st := PowerUnknown
	a, err := c.do(ctx, t, "power-state", func(ctx context.Context, s *session) error {
		var err error
		st, err = s.powerState(ctx)
		return err
	})
	return st, a, err
}

// SetPower performs a power action with uniform semantics: on when on,
// off or soft when off succeed without touching the machine; cycle and
// reset when off power on. The state is read first in the same session.
func (c *Controller) SetPower(ctx context.Context, t Target, action PowerAction) (Answer, error) {
	if action < ActionOn || action > ActionReset {
		return Answer{}, fmt.Errorf("%w: power action %d", ErrInvalid, int(action))
	}
	return c.do(ctx, t, "power-"+action.String(), func(ctx context.Context, s *session) error {
		st, err := s.powerState(ctx)
		if err != nil {
			return err
		}
		verb := action.String()
		switch {
		case action == ActionOn && st == PowerOn:
			s.answer.Note = "already on"
			return nil
		case (action == ActionOff || action == ActionSoftOff) && st == PowerOff:
			s.answer.Note = "already off"
			return nil
		case (action == ActionCycle || action == ActionReset) && st == PowerOff:
			s.answer.Note = "was off: " + verb + " became on"
			verb = "on"
		}
		s.share()
		start := time.Now()
		ok, err := s.cl.SetPowerState(ctx, verb)
		s.record(start)
		if err != nil {
			return err
		}
		// bmclib's Redfish provider reports soft off as not ok even when
		// the request was accepted; only an error counts as failure.
		_ = ok
		return nil
	})
}

// SetBootDevice sets the next boot device (one-shot unless
// opts.Persistent).
func (c *Controller) SetBootDevice(ctx context.Context, t Target, dev BootDevice, opts BootOptions) (Answer, error) {
	var name string
	switch dev {
	case BootPXE:
		name = string(bmc.BootDeviceTypePXE)
	case BootDisk:
		name = string(bmc.BootDeviceTypeDisk)
	case BootBIOS:
		name = string(bmc.BootDeviceTypeBIOS)
	default:
		return Answer{}, fmt.Errorf("%w: boot device %d", ErrInvalid, int(dev))
	}
	return c.do(ctx, t, "bootdev-"+dev.String(), func(ctx context.Context, s *session) error {
		s.share()
		start := time.Now()
		ok, err := s.cl.SetBootDevice(ctx, name, opts.Persistent, opts.EFI)
		s.record(start)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: boot device not accepted", ErrFailed)
		}
		return nil
	})
}

// Info asks the BMC about itself: the native provider reads Get Device ID;
// a Redfish BMC reports its system vendor and model.
func (c *Controller) Info(ctx context.Context, t Target) (Info, Answer, error) {
	var info Info
	a, err := c.do(ctx, t, "info", func(ctx context.Context, s *session) error {
		var errs []error
		for _, d := range s.cl.Registry.Drivers {
			if np, ok := d.DriverInterface.(*nativeProvider); ok {
				start := time.Now()
				pctx, cancel := context.WithTimeout(ctx, s.perCall)
				i, err := np.DeviceInfo(pctx)
				cancel()
				at := Attempt{Provider: NativeProviderName, Took: time.Since(start)}
				if err != nil {
					at.Err = err.Error()
					errs = append(errs, err)
				}
				s.answer.Attempts = append(s.answer.Attempts, at)
				if err == nil {
					info, s.answer.Provider = i, NativeProviderName
					return nil
				}
			}
		}
		start := time.Now()
		dev, err := s.cl.Inventory(ctx)
		s.record(start)
		if err == nil && dev != nil {
			info = Info{Provider: s.answer.Provider, Vendor: dev.Vendor, Model: dev.Model}
			if dev.BMC != nil && dev.BMC.Firmware != nil {
				info.Firmware = dev.BMC.Firmware.Installed
			}
			return nil
		}
		if err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	return info, a, err
}
