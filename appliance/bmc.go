package appliance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/appliance/metrics"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/ipmi/poller"
	"github.com/corralhq/corral/ipmi/seal"
)

// BMCConfig configures BMC control: sealed credentials and the power
// poller (docs/architecture.md, "The walk", Power). Zero values take the defaults.
type BMCConfig struct {
	// PollInterval is how often every enrolled machine's power state is
	// read (default 60s, jittered ±10%); negative disables the poller.
	PollInterval time.Duration
	// PollConcurrency bounds BMCs polled at once (default 16).
	PollConcurrency int
	// CallTimeout bounds each BMC call (default 10s).
	CallTimeout time.Duration
	// Providers is the provider order (default: native-ipmi, ipmitool,
	// gofish).
	Providers []string
	// HealthInterval is how often every machine's BMC sensors and event
	// log are read (default 5m, jittered ±10%); negative disables it.
	HealthInterval time.Duration
	// HealthSensors caps the sensors kept per machine (default 64).
	HealthSensors int
	// RotateEvery, when positive, rotates the password of every BMC
	// account Corral owns (machines rotated once) when it is older than
	// this; checked every RotateEvery/4, at most every 10 minutes.
	RotateEvery time.Duration
	// MediaURL is the boot HTTP server's URL as BMCs reach it (for
	// example http://10.0.0.1:8080), under which they fetch firmware
	// images and ISOs (/os-images/<sha256>); empty: the boot HTTP
	// server's address when it listens on a specific one.
	MediaURL string
}

// initBMC wires BMC control into s after the store and inventory exist:
// the seal key (created 0600 on first start), the ipmi Controller adapted
// to inventory's BMC interface, and the power poller as a component.
func (s *Server) initBMC() error {
	cfg := s.cfg.BMC
	for _, p := range cfg.Providers {
		switch p {
		case ipmi.NativeProviderName, ipmi.IpmitoolProviderName, ipmi.RedfishProviderName:
		default:
			return fmt.Errorf("BMC provider %q: use %s, %s or %s", p, ipmi.NativeProviderName, ipmi.IpmitoolProviderName, ipmi.RedfishProviderName)
		}
	}
	sealer, err := seal.Ensure(filepath.Join(s.cfg.DataDir, seal.KeyFile))
	if err != nil {
		return err
	}
	log := s.log.With("component", "bmc")
	ctl := ipmi.New(ipmi.Config{Logger: log, CallTimeout: cfg.CallTimeout, Providers: cfg.Providers, Observe: s.obs.BMC()})
	ad := bmcAdapter{c: ctl, sensors: cfg.HealthSensors}
	sensors := s.obs.Sensors()
	bcfg := bmc.Config{Machines: s.inv, Events: s.inv, Store: s.store, Driver: ad, Sealer: sealer, Logger: log, CallTimeout: cfg.CallTimeout,
		Accounts: ad, Consoles: ad}
	if cfg.HealthInterval >= 0 {
		bcfg.Health = ad
		if sensors != nil {
			bcfg.OnHealth = func(machine string, h bmc.Health) { sensors(machine, sensorReadings(h)) }
		}
	}
	bc, err := bmc.New(bcfg)
	if err != nil {
		return err
	}
	s.inv.OnDelete(bc.Forget)
	if sensors != nil {
		s.inv.OnDelete(func(_ context.Context, m *inventoryv1.Machine) { sensors(m.GetName(), nil) })
	}
	s.bmc = bc
	bmc.RegisterCredentials(s.grpc, &bmc.CredentialServer{BMC: bc})
	if err := s.initBMCRedfish(bc, ad); err != nil {
		return err
	}
	// Rotations an appliance left unfinished are finished at start (the
	// pending credential tried first, then the one in use), for the
	// machines this appliance owns.
	s.addComponent("bmc-rotation-resume", func(ctx context.Context) error {
		bc.ResumeRotations(ctx, s.owns)
		if cfg.RotateEvery <= 0 {
			<-ctx.Done()
			return nil
		}
		t := time.NewTicker(min(cfg.RotateEvery/4, 10*time.Minute))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				bc.RotateDue(ctx, cfg.RotateEvery, s.owns)
			}
		}
	})
	if cfg.HealthInterval >= 0 {
		hp, err := poller.New(poller.Config{Source: healthSource{bc}, Logger: log.With("component", "health-poller"),
			Interval: cmp.Or(cfg.HealthInterval, 5*time.Minute), Concurrency: cfg.PollConcurrency,
			CallTimeout: 2*cfg.CallTimeout + 5*time.Second, Filter: s.owns})
		if err != nil {
			return err
		}
		s.addComponent("health-poller", hp.Run)
	}
	if cfg.PollInterval < 0 {
		return nil
	}
	p, err := poller.New(poller.Config{Source: bc, Logger: log.With("component", "power-poller"), Interval: cfg.PollInterval,
		Concurrency: cfg.PollConcurrency, CallTimeout: cfg.CallTimeout + 5*time.Second,
		// In a fleet, only the machines the leader dispatched here
		// (fleet.go sets s.owner); alone, every machine.
		Filter: s.owns})
	if err != nil {
		return err
	}
	s.addComponent("power-poller", p.Run)
	return nil
}

// bmcAdapter presents an ipmi.Controller as bmc.Driver, translating
// types and wrapping ipmi's errors with BMC control's sentinels.
type bmcAdapter struct {
	c *ipmi.Controller
	// sensors caps the sensors of a health read (0: ipmi's default).
	sensors int
}

func toTarget(t bmc.Target) ipmi.Target {
	p := ipmi.ProtocolAuto
	switch t.Protocol {
	case inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI:
		p = ipmi.ProtocolIPMI
	case inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH:
		p = ipmi.ProtocolRedfish
	default:
		// AUTO (and unspecified): ProtocolAuto, set above.
	}
	tg := ipmi.Target{Host: t.Host, Port: int(t.Port), Protocol: p, Username: t.Username, Password: t.Password,
		CipherSuite: int(t.CipherSuite), Timeout: t.Timeout}
	// A target with no pin and neither flag stays TLSPinned with nothing
	// pinned: the Redfish provider is then not tried.
	switch {
	case t.TLSInsecure:
		tg.TLSMode = ipmi.TLSInsecure
	case t.TLSFirstUse:
		tg.TLSMode = ipmi.TLSFirstUse
	default:
		tg.TLSMode, tg.TLSSHA256 = ipmi.TLSPinned, t.TLSSHA256
	}
	return tg
}

func toResult(a ipmi.Answer) bmc.Result {
	r := bmc.Result{Provider: a.Provider, Note: a.Note, TLSSHA256: a.TLSSHA256}
	for _, at := range a.Attempts {
		r.Attempts = append(r.Attempts, &inventoryv1.ProviderAttempt{Provider: at.Provider, Error: at.Err, TookMs: uint32(at.Took.Milliseconds())})
	}
	return r
}

func toInventoryErr(err error) error {
	var ce *ipmi.CertificateError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		// Inventory says what the operator should do about it.
		return &bmc.CertificateError{Pinned: ce.Pinned, Presented: ce.Presented}
	case errors.Is(err, ipmi.ErrAuth):
		return fmt.Errorf("%w: %w", bmc.ErrAuth, err)
	case errors.Is(err, ipmi.ErrInvalid):
		return fmt.Errorf("%w: %w", apierr.ErrInvalid, err)
	case errors.Is(err, ipmi.ErrFailed):
		return fmt.Errorf("%w: %w", bmc.ErrFailed, err)
	case errors.Is(err, ipmi.ErrUnreachable), errors.Is(err, ipmi.ErrProtocol):
		return fmt.Errorf("%w: %w", apierr.ErrUnavailable, err)
	}
	return err
}

func (b bmcAdapter) PowerState(ctx context.Context, t bmc.Target) (inventoryv1.PowerState, bmc.Result, error) {
	st, a, err := b.c.PowerState(ctx, toTarget(t))
	if err != nil {
		return inventoryv1.PowerState_POWER_STATE_UNKNOWN, toResult(a), toInventoryErr(err)
	}
	ps := inventoryv1.PowerState_POWER_STATE_UNKNOWN
	switch st {
	case ipmi.PowerOn:
		ps = inventoryv1.PowerState_POWER_STATE_ON
	case ipmi.PowerOff:
		ps = inventoryv1.PowerState_POWER_STATE_OFF
	default:
		// PowerUnknown: UNKNOWN, set above.
	}
	return ps, toResult(a), nil
}

func (b bmcAdapter) SetPower(ctx context.Context, t bmc.Target, action inventoryv1.PowerAction) (bmc.Result, error) {
	var a ipmi.PowerAction
	switch action {
	case inventoryv1.PowerAction_POWER_ACTION_ON:
		a = ipmi.ActionOn
	case inventoryv1.PowerAction_POWER_ACTION_OFF:
		a = ipmi.ActionOff
	case inventoryv1.PowerAction_POWER_ACTION_SOFT_OFF:
		a = ipmi.ActionSoftOff
	case inventoryv1.PowerAction_POWER_ACTION_CYCLE:
		a = ipmi.ActionCycle
	case inventoryv1.PowerAction_POWER_ACTION_RESET:
		a = ipmi.ActionReset
	default:
		return bmc.Result{}, fmt.Errorf("%w: power action %v", apierr.ErrInvalid, action)
	}
	ans, err := b.c.SetPower(ctx, toTarget(t), a)
	return toResult(ans), toInventoryErr(err)
}

func (b bmcAdapter) SetBootDevice(ctx context.Context, t bmc.Target, r inventory.BootRequest) (bmc.Result, error) {
	var d ipmi.BootDevice
	switch r.Device {
	case inventoryv1.BootDevice_BOOT_DEVICE_PXE:
		d = ipmi.BootPXE
	case inventoryv1.BootDevice_BOOT_DEVICE_DISK:
		d = ipmi.BootDisk
	case inventoryv1.BootDevice_BOOT_DEVICE_BIOS:
		d = ipmi.BootBIOS
	default:
		return bmc.Result{}, fmt.Errorf("%w: boot device %v", apierr.ErrInvalid, r.Device)
	}
	ans, err := b.c.SetBootDevice(ctx, toTarget(t), d, ipmi.BootOptions{Persistent: r.Persistent, EFI: r.EFI})
	return toResult(ans), toInventoryErr(err)
}

func (b bmcAdapter) NewPassword() string { return ipmi.NewPassword() }

func (b bmcAdapter) SetAccount(ctx context.Context, t bmc.Target, a bmc.Account) (uint32, bmc.Result, error) {
	id, ans, err := b.c.SetAccount(ctx, toTarget(t), ipmi.Account{ID: int(a.ID), Name: a.Name, Password: a.Password})
	return uint32(id), toResult(ans), toInventoryErr(err)
}

func (b bmcAdapter) DisableAccount(ctx context.Context, t bmc.Target, id uint32) (bmc.Result, error) {
	ans, err := b.c.DisableAccount(ctx, toTarget(t), int(id))
	return toResult(ans), toInventoryErr(err)
}

// healthSource drives the poller over BMC health instead of power.
type healthSource struct{ bc *bmc.Service }

func (h healthSource) PowerTargets(ctx context.Context) ([]string, error) {
	return h.bc.HealthTargets(ctx)
}
func (h healthSource) RefreshPower(ctx context.Context, name string) error {
	return h.bc.RefreshHealth(ctx, name)
}

func sensorReadings(h bmc.Health) []metrics.SensorReading {
	out := make([]metrics.SensorReading, 0, len(h.Sensors))
	for _, s := range h.Sensors {
		out = append(out, metrics.SensorReading{Kind: s.GetKind(), Value: s.GetValue(), Status: s.GetStatus()})
	}
	return out
}

func (b bmcAdapter) Health(ctx context.Context, t bmc.Target, logSeen time.Time) (bmc.Health, bmc.Result, error) {
	h, a, err := b.c.Health(ctx, toTarget(t), ipmi.HealthOptions{MaxSensors: b.sensors, LogSeen: logSeen})
	if err != nil {
		return bmc.Health{}, toResult(a), toInventoryErr(err)
	}
	out := bmc.Health{Dropped: h.Dropped, LogAddedAt: h.LogAddedAt, LogRead: h.LogRead}
	for _, s := range h.Sensors {
		out.Sensors = append(out.Sensors, &inventoryv1.BmcSensor{Name: s.Name, Kind: s.Kind, Value: s.Value, Unit: s.Unit, Status: s.Status, Threshold: s.Threshold})
	}
	for _, e := range h.Log {
		out.Log = append(out.Log, bmc.HealthLogEntry{ID: uint32(e.ID), Time: e.Time, Critical: e.Critical, Text: e.Text})
	}
	return out, toResult(a), nil
}

func (b bmcAdapter) SerialConsoleSSH(ctx context.Context, t bmc.Target) (bmc.SerialConsoleSSH, bmc.Result, error) {
	sc, a, err := b.c.SerialConsoleSSH(ctx, toTarget(t))
	if err != nil {
		return bmc.SerialConsoleSSH{}, toResult(a), toRedfishErr(err)
	}
	return bmc.SerialConsoleSSH{Source: sc.Source, Enabled: sc.Enabled, Port: sc.Port, EntryCommand: sc.EntryCommand, HotKey: sc.HotKey,
		Shared: sc.SharedWithManagerCLI}, toResult(a), nil
}
