package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MaxAppliances bounds the endpoints a node dials (the kernel command
// line's and the install plan's bound, agent/cmdline.MaxEndpoints, which
// this package may not import).
const MaxAppliances = 8

// Appliances are the appliances of a fleet a node dials, in order, and the
// one it is on now. Every call to the appliance — the heartbeat's
// ApplyNode (ApplianceRegistry), the first Join (Enrol) and the renewals'
// (Renew) — goes to the current one; when it does not answer (the
// connection is refused or drops, the handshake fails, the call times out:
// gRPC Unavailable or DeadlineExceeded) the node moves on to the next,
// wrapping around, and stays there while it answers. All appliances of a
// fleet share the CA and the store, so any of them serves the node. Each
// move and each first answer from an appliance is logged with its
// endpoint ("appliance"). Safe for concurrent use; share one between the
// registry and the renewer, so both follow the same failover.
type Appliances struct {
	list []string
	log  *slog.Logger

	mu  sync.Mutex
	cur int    // index in list of the appliance calls go to
	on  string // the appliance that answered last, "" before any
}

// NewAppliances checks endpoints (host:port each, 1 to MaxAppliances; a
// repeat is kept once, in its first place) and starts on the first. log
// receives the failovers; nil discards.
func NewAppliances(endpoints []string, log *slog.Logger) (*Appliances, error) {
	var list []string
	for i, e := range endpoints {
		if h, _, err := net.SplitHostPort(e); err != nil || h == "" {
			return nil, fmt.Errorf("node: appliance endpoint %d %q: want host:port", i+1, e)
		}
		if !slices.Contains(list, e) {
			list = append(list, e)
		}
	}
	switch {
	case len(list) == 0:
		return nil, errors.New("node: no appliance endpoint")
	case len(list) > MaxAppliances:
		return nil, fmt.Errorf("node: %d appliance endpoints, at most %d", len(list), MaxAppliances)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Appliances{list: list, log: log}, nil
}

// single is the Appliances of one endpoint (configurations without a
// list); its failover stays in place.
func single(target string) *Appliances {
	return &Appliances{list: []string{target}, log: slog.New(slog.DiscardHandler)}
}

// List returns the endpoints in order.
func (a *Appliances) List() []string { return slices.Clone(a.list) }

// Current is the endpoint calls go to now.
func (a *Appliances) Current() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.list[a.cur]
}

// String names the current appliance and the list.
func (a *Appliances) String() string {
	return fmt.Sprintf("%s (of %s)", a.Current(), strings.Join(a.list, ","))
}

// answered records that ep answered a call; the first answer from an
// appliance after another (or none) is logged.
func (a *Appliances) answered(ep, call string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.on == ep {
		return
	}
	prev := a.on
	a.on = ep
	if prev == "" {
		a.log.Info("on appliance", "appliance", ep, "call", call)
		return
	}
	a.log.Info("on appliance after failover", "appliance", ep, "previous", prev, "call", call)
}

// failed records that ep did not answer: when calls still go to ep, they
// go to the next appliance from now on. It returns the appliance calls go
// to.
func (a *Appliances) failed(ep, call string, err error) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.list) > 1 && a.list[a.cur] == ep {
		a.cur = (a.cur + 1) % len(a.list)
		a.log.Warn("appliance not answering: failing over", "appliance", ep, "next", a.list[a.cur], "call", call, "err", err)
	}
	return a.list[a.cur]
}

// unanswered reports whether err says the appliance did not answer (as
// opposed to answering with a refusal): the cases that fail over.
func unanswered(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	default: // an answer, if a refusal
		return false
	}
}

// do runs call against the current appliance and, while the appliances
// do not answer, against the next ones, each at most once, until one
// answers or ctx ends. It returns call's last error; an appliance's
// refusal (any other error) is returned at once, without failing over.
func (a *Appliances) do(ctx context.Context, name string, call func(ep string) error) error {
	var err error
	for range len(a.list) {
		ep := a.Current()
		if err = call(ep); err == nil {
			a.answered(ep, name)
			return nil
		}
		if !unanswered(err) {
			a.answered(ep, name) // it answered, with a refusal
			return err
		}
		a.failed(ep, name, err)
		if ctx.Err() != nil {
			return err
		}
	}
	return err
}
