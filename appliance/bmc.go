package appliance

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
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
	bc, err := bmc.New(bmc.Config{Machines: s.inv, Events: s.inv, Store: s.store, Driver: bmcAdapter{ctl}, Sealer: sealer, Logger: log, CallTimeout: cfg.CallTimeout,
		Accounts: bmcAdapter{ctl}})
	if err != nil {
		return err
	}
	s.inv.OnDelete(bc.Forget)
	s.bmc = bc
	bmc.RegisterCredentials(s.grpc, &bmc.CredentialServer{BMC: bc})
	// Rotations an appliance left unfinished are finished at start (the
	// pending credential tried first, then the one in use), for the
	// machines this appliance owns.
	s.addComponent("bmc-rotation-resume", func(ctx context.Context) error {
		bc.ResumeRotations(ctx, s.owns)
		<-ctx.Done()
		return nil
	})
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
type bmcAdapter struct{ c *ipmi.Controller }

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
