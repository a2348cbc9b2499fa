package http

import (
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// ScriptLimits rate-limit /boot.ipxe. Every script render can mint a
// per-boot token (one store write) and creates a DISCOVERED machine for an
// unknown MAC in off mode, so scripts are budgeted per boot MAC and per
// source address; a request over either budget gets 429 with Retry-After.
// Zero (or negative) fields take the defaults of DefaultScriptLimits.
//
// The defaults are generous for real PXE: a machine asks for its script
// once per boot, iPXE retries a failed fetch a few times, and a machine
// that reboots in a loop asks every minute or so. One source address is
// one client on a boot LAN — a DHCP relay forwards, it does not NAT, so
// relayed clients keep their own addresses — so the address budget is
// larger than a MAC's (a machine's several NICs, a retrying firmware) but
// still far below what one client asking for many MACs would need.
type ScriptLimits struct {
	// MACBurst scripts for one MAC at once, then one per MACInterval.
	MACBurst    int
	MACInterval time.Duration
	// AddrBurst scripts for one source address at once, then one per
	// AddrInterval.
	AddrBurst    int
	AddrInterval time.Duration
	// MaxTracked bounds each table (MACs, addresses) of budgets in use.
	// A full table first forgets budgets that have refilled (the same as
	// new); if none has, the least recently used one goes, with a log
	// line.
	MaxTracked int
}

// DefaultScriptLimits returns the defaults: per MAC a burst of 10 then one every 6 s; per
// source address a burst of 20 then one a second; 65,536 tracked keys per
// table (a few MB).
func DefaultScriptLimits() ScriptLimits {
	return ScriptLimits{MACBurst: 10, MACInterval: 6 * time.Second, AddrBurst: 20, AddrInterval: time.Second, MaxTracked: 1 << 16}
}

// WithDefaults fills zero or negative fields from DefaultScriptLimits.
func (l ScriptLimits) WithDefaults() ScriptLimits {
	d := DefaultScriptLimits()
	if l.MACBurst <= 0 {
		l.MACBurst = d.MACBurst
	}
	if l.MACInterval <= 0 {
		l.MACInterval = d.MACInterval
	}
	if l.AddrBurst <= 0 {
		l.AddrBurst = d.AddrBurst
	}
	if l.AddrInterval <= 0 {
		l.AddrInterval = d.AddrInterval
	}
	if l.MaxTracked <= 0 {
		l.MaxTracked = d.MaxTracked
	}
	return l
}

// Validate refuses negative values (corrald's flags); zero means default.
func (l ScriptLimits) Validate() error {
	switch {
	case l.MACBurst < 0:
		return fmt.Errorf("--boot-script-mac-burst %d: must not be negative", l.MACBurst)
	case l.MACInterval < 0:
		return fmt.Errorf("--boot-script-mac-interval %s: must not be negative", l.MACInterval)
	case l.AddrBurst < 0:
		return fmt.Errorf("--boot-script-addr-burst %d: must not be negative", l.AddrBurst)
	case l.AddrInterval < 0:
		return fmt.Errorf("--boot-script-addr-interval %s: must not be negative", l.AddrInterval)
	case l.MaxTracked < 0:
		return fmt.Errorf("--boot-script-max-tracked %d: must not be negative", l.MaxTracked)
	}
	return nil
}

// budgets is a bounded table of token buckets, one per key. Safe for
// concurrent use.
type budgets struct {
	burst int
	every time.Duration
	max   int

	mu      sync.Mutex
	entries map[string]*budget
	evicted int // live budgets forgotten because the table was full
}

type budget struct {
	lim  *rate.Limiter
	used time.Time // last request
	// noted is when a refusal of this key was last put on a timeline.
	noted time.Time
}

func newBudgets(burst int, every time.Duration, maxKeys int) *budgets {
	return &budgets{burst: burst, every: every, max: maxKeys, entries: map[string]*budget{}}
}

// take spends one request of key's budget at now. It reports whether the
// request may go ahead and, if not, how long until it could; note is true
// when the caller should record the refusal on the timeline (at most once
// a minute per key).
func (b *budgets) take(key string, now time.Time) (ok bool, retry time.Duration, note bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil {
		if len(b.entries) >= b.max {
			b.makeRoomLocked(now)
		}
		e = &budget{lim: rate.NewLimiter(rate.Every(b.every), b.burst)}
		b.entries[key] = e
	}
	e.used = now
	if e.lim.AllowN(now, 1) {
		return true, 0, false
	}
	missing := 1 - e.lim.TokensAt(now)
	retry = time.Duration(math.Ceil(missing * float64(b.every)))
	if now.Sub(e.noted) >= time.Minute {
		e.noted = now
		note = true
	}
	return false, retry, note
}

// makeRoomLocked drops budgets that have refilled (forgetting them changes
// nothing); when none has, the least recently used one.
func (b *budgets) makeRoomLocked(now time.Time) {
	full := time.Duration(b.burst) * b.every
	for k, e := range b.entries {
		if now.Sub(e.used) >= full {
			delete(b.entries, k)
		}
	}
	if len(b.entries) < b.max {
		return
	}
	var oldK string
	var old *budget
	for k, e := range b.entries {
		if old == nil || e.used.Before(old.used) {
			oldK, old = k, e
		}
	}
	delete(b.entries, oldK)
	b.evicted++
}

// takeEvicted returns and resets how many live budgets were forgotten.
func (b *budgets) takeEvicted() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.evicted
	b.evicted = 0
	return n
}

func (b *budgets) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.entries)
}

// retryAfter renders a wait as a Retry-After value: whole seconds, at
// least 1.
func retryAfter(d time.Duration) string {
	return fmt.Sprint(max(1, int64(math.Ceil(d.Seconds()))))
}
