package dhcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// supersede releases each older binding by compare-and-swap, re-checked
// on the stored record: only while it is still the MAC's live binding at
// a revision below the newer binding's (a renewal since then made it the
// newest: it stays). Failures are logged; the binding then just runs out
// at its expiry.
func (p *leases) supersede(ctx context.Context, olds ...stale) {
	for _, o := range olds {
		released, err := p.releaseOlder(ctx, o)
		if err != nil {
			p.log.Warn("releasing a superseded lease failed; it runs out at its expiry", "mac", o.mac, "ip", o.ip.String(), "newer", o.newer.String(), "err", err)
			continue
		}
		if released {
			p.superseded.Add(1)
			p.log.Info("lease superseded: the client was bound again in the same subnet", "mac", o.mac, "ip", o.ip.String(), "newer", o.newer.String())
		}
	}
}

func (p *leases) releaseOlder(ctx context.Context, o stale) (bool, error) {
	for range 5 {
		kv, err := p.st.Get(ctx, leaseKey(o.ip))
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		_, l, err := decodeLease(kv)
		if err != nil {
			return false, err
		}
		now := p.now()
		if kv.Revision >= o.newerRev || !live(l, now) || l.GetMac() != o.mac || l.GetPinnedBy() != "" {
			// Renewed, released or rebound since: it is not the older
			// binding any more (or it is pinned: it stays). Memory learns the record from its watch
			// event, and decides then what it implies.
			return false, nil
		}
		l.State, l.ExpiresUnix, l.UpdatedUnix = bootv1.Lease_STATE_RELEASED, now.Unix(), now.Unix()
		rev, err := record.Put(ctx, p.st, kv.Key, l, kv.Revision)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return false, err
		}
		p.mu.Lock()
		p.setLocked(o.ip, l, rev, "", now)
		p.mu.Unlock()
		return true, nil
	}
	return false, fmt.Errorf("dhcp: release %s: too many conflicting writers", o.ip)
}

// scatter moves r's allocation cursor to a random address when another
// writer bound ip, which memory thought never used, to another client:
// another appliance is handing out r's never-used addresses in the same
// order. After a collision or two the appliances allocate from different
// parts of the range, and their offers stop colliding until the parts
// meet. An appliance alone sees this only when its range is exhausted
// (it then hands out other clients' pending offers), so its allocation
// stays lowest-first.
func (p *leases) scatter(ip netip.Addr, mac string, r Range) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byIP[ip]; !ok || e.mac == mac {
		return
	}
	a, b := r.Start.As4(), r.End.As4()
	lo, hi := binary.BigEndian.Uint32(a[:]), binary.BigEndian.Uint32(b[:])
	off := rand.Uint32()
	if n := hi - lo + 1; n != 0 { // n == 0: the range is all of IPv4
		off = rand.Uint32N(n)
	}
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], lo+off)
	p.next[r.Subnet] = netip.AddrFrom4(out)
}

// reload refreshes one address from the store (after a CAS conflict, or
// when memory knows no lease of a client: another appliance may have
// written it). It reads the current revision, never a replica's
// (store.WithFreshReads): what it finds is what memory keeps and what the
// next compare-and-swap is judged against.
func (p *leases) reload(ctx context.Context, ip netip.Addr) error {
	kv, err := p.st.Get(store.WithFreshReads(ctx), leaseKey(ip))
	if errors.Is(err, store.ErrNotFound) {
		p.mu.Lock()
		p.forgetLocked(ip)
		p.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	_, l, err := decodeLease(kv)
	if err != nil {
		return err
	}
	p.mu.Lock()
	older, two := p.setLocked(ip, l, kv.Revision, "", p.now())
	p.mu.Unlock()
	if two {
		p.supersede(ctx, older)
	}
	return nil
}

// forgetLocked drops ip's lease from memory (caller holds mu).
func (p *leases) forgetLocked(ip netip.Addr) {
	if e, ok := p.byIP[ip]; ok && p.byMAC[e.mac] == ip {
		delete(p.byMAC, e.mac)
	}
	delete(p.byIP, ip)
}

// follow keeps memory current with the lease records other appliances
// sharing the store write: it watches LeasePrefix, then re-lists (so that
// nothing written between the last look and the watch is missed), and
// applies every record newer than memory's. When the watch ends (the
// store disconnected a watcher that fell behind, or etcd lost its leader)
// it starts over after a pause that doubles while watches keep ending
// soon (up to 30 s): bbolt, whose one appliance needs no watch, drops a
// watcher that a group commit of more than its buffer overflows, and the
// re-read is a List of every lease. Meanwhile memory is stale, which
// costs NAKs, never a wrong binding. It returns when ctx ends; the errors of
// each watch are logged, not returned.
func (p *leases) follow(ctx context.Context) {
	const first, most = 100 * time.Millisecond, 30 * time.Second
	pause := first
	for {
		began := time.Now()
		err := p.followOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > 2*time.Minute {
			pause = first
		}
		level := slog.LevelDebug
		switch {
		case err != nil:
			level = slog.LevelWarn
		case pause == first:
			level = slog.LevelInfo
		}
		p.log.Log(ctx, level, "lease watch ended; re-reading the leases after a pause", "err", err, "pause", pause.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, most)
	}
}

// followOnce watches, re-reads, and applies events until the watch ends.
func (p *leases) followOnce(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := p.st.Watch(wctx, LeasePrefix)
	if err != nil {
		return err
	}
	if err := p.resync(ctx); err != nil {
		return err
	}
	p.apply(ctx, ch)
	return nil
}

// resync applies every stored lease newer than memory's.
func (p *leases) resync(ctx context.Context) error {
	kvs, err := p.st.List(ctx, LeasePrefix)
	if err != nil {
		return err
	}
	var older []stale
	p.mu.Lock()
	now := p.now()
	for _, kv := range kvs {
		ip, err := netip.ParseAddr(strings.TrimPrefix(kv.Key, LeasePrefix))
		if e, ok := p.byIP[ip]; err == nil && ok && e.rev >= kv.Revision {
			continue // known: no decoding
		}
		if ip, l, err := decodeLease(kv); err == nil {
			if o, ok := p.setLocked(ip, l, kv.Revision, "", now); ok {
				older = append(older, o)
			}
		}
	}
	p.mu.Unlock()
	p.supersede(ctx, older...)
	return nil
}

// apply applies watch events until the channel closes, a batch of the
// events already queued under one lock.
func (p *leases) apply(ctx context.Context, ch <-chan store.Event) {
	const batch = 256
	evs := make([]store.Event, 0, batch)
	for ev := range ch {
		evs = append(evs[:0], ev)
	more:
		for len(evs) < batch {
			select {
			case ev, ok := <-ch:
				if !ok {
					break more
				}
				evs = append(evs, ev)
			default:
				break more
			}
		}
		var older []stale
		p.mu.Lock()
		now := p.now()
		for _, ev := range evs {
			ip, err := netip.ParseAddr(strings.TrimPrefix(ev.KV.Key, LeasePrefix))
			if err != nil {
				continue
			}
			if e, ok := p.byIP[ip]; ok && e.rev >= ev.KV.Revision {
				continue // our own write, or older than what we know
			}
			if ev.Type == store.EventDelete {
				p.forgetLocked(ip)
				continue
			}
			_, l, err := decodeLease(ev.KV)
			if err != nil {
				p.log.Warn("skipping undecodable lease record", "key", ev.KV.Key, "err", err)
				continue
			}
			if o, ok := p.setLocked(ip, l, ev.KV.Revision, "", now); ok {
				older = append(older, o)
			}
		}
		p.mu.Unlock()
		p.supersede(ctx, older...)
	}
}
