package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/appliance/webhook"
	"github.com/spf13/pflag"
)

// addWebhookFlags registers the bounds of event export (package
// appliance/webhook).
func addWebhookFlags(f *pflag.FlagSet, c *appliance.WebhooksConfig) {
	f.IntVar(&c.QueueSize, "webhook-queue", webhook.DefaultQueueSize, "events queued per webhook receiver; an event that finds the queue full cuts the receiver off (env CORRAL_WEBHOOK_QUEUE)")
	f.UintVar(&c.MaxAttempts, "webhook-max-attempts", webhook.DefaultMaxAttempts, "attempts to deliver one event before it is dropped (env CORRAL_WEBHOOK_MAX_ATTEMPTS)")
	f.DurationVar(&c.MaxAge, "webhook-max-age", webhook.DefaultMaxAge, "how long one event is retried before it is dropped (env CORRAL_WEBHOOK_MAX_AGE)")
	f.DurationVar(&c.InitialInterval, "webhook-retry-initial", webhook.DefaultInitialInterval, "first pause before a delivery is retried; doubled each time up to 30s, with jitter (env CORRAL_WEBHOOK_RETRY_INITIAL)")
	f.DurationVar(&c.Timeout, "webhook-timeout", webhook.DefaultTimeout, "bound on one delivery attempt: connect, TLS and the receiver's answer (env CORRAL_WEBHOOK_TIMEOUT)")
}
