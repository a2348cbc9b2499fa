package appliance

import (
	"cmp"
	"path/filepath"
	"time"

	"github.com/corralhq/corral/appliance/webhook"
	"github.com/corralhq/corral/ipmi/seal"
)

// WebhooksConfig bounds event export (package appliance/webhook; zero
// values take its defaults).
type WebhooksConfig struct {
	// QueueSize is each receiver's queue (--webhook-queue): an event that
	// finds it full cuts the receiver off.
	QueueSize int
	// MaxAttempts and MaxAge bound one event's retries
	// (--webhook-max-attempts, --webhook-max-age); InitialInterval is the
	// first pause between them (--webhook-retry-initial), doubled each
	// time up to 30 s, with jitter.
	MaxAttempts     uint
	MaxAge          time.Duration
	InitialInterval time.Duration
	// Timeout bounds one attempt (--webhook-timeout).
	Timeout time.Duration
}

// initWebhooks wires event export (package appliance/webhook):
// WebhookService on every appliance; the dispatcher as the leader's
// singleton work, so a fleet sends each event once. Receivers' secrets are
// sealed under the data directory's seal key, which a fleet shares
// (shareSecrets), so whichever appliance leads can sign.
func (s *Server) initWebhooks() error {
	sealer, err := seal.Ensure(filepath.Join(s.cfg.DataDir, seal.KeyFile))
	if err != nil {
		return err
	}
	log := s.log.With("component", "webhooks")
	svc := webhook.NewService(s.store, sealer, webhook.Guard{BootLAN: s.bootLANRanges()}, log)
	d, err := webhook.NewDispatcher(webhook.Config{Store: s.store, Service: svc, Registerer: s.obs.Registerer(), Logger: log,
		Source: "corral://" + cmp.Or(s.cfg.Fleet.Name, "appliance"), QueueSize: s.cfg.Webhooks.QueueSize,
		MaxAttempts: s.cfg.Webhooks.MaxAttempts, MaxAge: s.cfg.Webhooks.MaxAge, Timeout: s.cfg.Webhooks.Timeout,
		InitialInterval: s.cfg.Webhooks.InitialInterval})
	if err != nil {
		return err
	}
	svc.Register(s.grpc)
	s.addSingleton("webhooks", d.Run)
	return nil
}

// bootLANRanges are the boot LAN's addresses webhook receivers may not be
// dialled at without --allow-boot-lan: the DHCP ranges (local, relayed,
// DHCPv6) and the boot interface's subnets.
func (s *Server) bootLANRanges() []webhook.Range {
	var out []webhook.Range
	b := s.cfg.Boot
	for _, r := range append([]string{b.DHCPRange, b.DHCP6Range}, b.DHCPRelayRanges...) {
		if r == "" {
			continue
		}
		if rs, err := webhook.ParseBootRange(r); err == nil {
			out = append(out, rs...)
		}
	}
	if b.Interface != "" {
		out = append(out, webhook.InterfaceRanges(b.Interface)...)
	}
	return out
}
