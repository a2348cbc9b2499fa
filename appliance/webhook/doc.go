// Package webhook is event export: webhook receivers kept in the store
// (WebhookService) and the dispatcher that posts CloudEvents to them —
// machine state changes, audit events and health conditions, each signed
// with the receiver's secret (Standard Webhooks headers and GitHub's
// X-Hub-Signature-256), through a bounded queue per receiver, with
// retries, and only to addresses the receiver was allowed to reach
// (docs/architecture.md, "Webhooks").
//
// It imports the API, the store and the seal (the secret is sealed at
// rest under the appliance's seal key); it takes the boot LAN's ranges and
// a Prometheus registerer through its Config and never imports the
// appliance.
package webhook
