// Package etcd implements the store contract on an etcd cluster, for
// several appliances sharing one fleet.
//
// Every key lives under a prefix (default "/corral"), so one etcd cluster can
// hold several fleets or other tenants. A record's revision is etcd's mod
// revision, which is cluster-wide and strictly increasing, so revisions keep
// the contract's meaning across appliances. Compare-and-swap maps onto etcd
// transactions: a create compares the key's create revision with 0, an update
// or delete compares its mod revision with the caller's, and a Txn is one
// etcd transaction of all its compares and writes. Update (the
// contract's Updater) is a read-compare-swap loop bounded in attempts: etcd
// has no server-side functions, so writers of one hot key do conflict here,
// and the loop retries them with a jittered back-off.
//
// Requests carry a deadline (Options.RequestTimeout): without quorum etcd
// leaves linearizable requests waiting, and an API call must fail with a clear
// Unavailable instead of hanging.
//
// A storm offers far more work than a cluster commits, so each appliance
// admits at most Options.MaxInFlight requests to etcd at once, fewer while
// etcd answers slowly, and queues the rest (admit.go): a request waits for its turn at most Options.AdmitWait,
// and only its time at etcd counts against RequestTimeout, so the work that
// is admitted finishes instead of expiring behind a pile-up; one that is not
// admitted, or that finds Options.MaxQueued others waiting, is refused at
// once with ResourceExhausted and a retry hint, before it costs etcd
// anything. etcd's own refusals that commit nothing ("too many requests",
// no leader) are retried with a jittered back-off within the deadline.
// Nothing is cached: every Get and List is a
// linearizable read, so a record written through one appliance is read back
// through any other.
package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cenkalti/backoff/v5"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
)

// Defaults for Options.
const (
	DefaultPrefix         = "/corral"
	DefaultRequestTimeout = 5 * time.Second
	DefaultDialTimeout    = 5 * time.Second
	// DefaultUpdateAttempts bounds Update's read-compare-swap loop.
	DefaultUpdateAttempts = 1000
	// DefaultWatchBuffer is how many events a watcher may fall behind by
	// before it is disconnected.
	DefaultWatchBuffer = 1024
	// DefaultMaxInFlight bounds one appliance's requests at etcd at once.
	DefaultMaxInFlight = 64
	// DefaultMaxQueued bounds the requests waiting for a turn.
	DefaultMaxQueued = 4096
	// listPage is how many keys one range request of List returns; List
	// reads every page at the first page's revision, so the result is one
	// consistent snapshot however long it is.
	listPage = 2000
)

// Options configures a Store. Zero values take the defaults.
type Options struct {
	// Endpoints are the cluster members' client URLs (http:// or https://).
	Endpoints []string
	// Prefix is prepended to every key (default "/corral"); it must start
	// with "/" and must not end with one.
	Prefix string
	// CAFile, CertFile and KeyFile configure TLS to etcd: CAFile verifies
	// the members, CertFile+KeyFile authenticate this appliance. https://
	// endpoints without CAFile verify against the system roots.
	CAFile, CertFile, KeyFile string
	// DialTimeout bounds the first connection (default 5s).
	DialTimeout time.Duration
	// RequestTimeout bounds every request (default 5s).
	RequestTimeout time.Duration
	// UpdateAttempts bounds Update's retries (default 1000).
	UpdateAttempts int
	// WatchBuffer is each watcher's buffer (default 1024).
	WatchBuffer int
	// MaxInFlight bounds the requests this store has at etcd at once
	// (default 64; the bound adapts below it to the cluster's pace:
	// admit.go); MaxQueued bounds those waiting for a turn (default
	// 4096), AdmitWait how long one waits (default RequestTimeout).
	// Watches do not count.
	MaxInFlight int
	MaxQueued   int
	AdmitWait   time.Duration
	Logger      *slog.Logger
}

// Store is a store.Store and store.Updater on etcd.
type Store struct {
	cli    *clientv3.Client
	prefix string
	opts   Options
	log    *slog.Logger

	mu     sync.Mutex
	closed bool
	// stripes serialise this process's Updates of one key.
	stripes [updateStripes]sync.Mutex
	// adm admits requests to etcd (admit.go).
	adm *admission
	// grp sends the writes waiting for etcd together (group.go).
	grp group
	// stop ends every watcher when the store closes.
	stop context.CancelFunc
	base context.Context
	wg   sync.WaitGroup
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.Updater        = (*Store)(nil)
	_ store.HistoryWatcher = (*Store)(nil)
)

// ParseURL reads a store address of the form
// etcd://host:port[,host:port...][/prefix] (members reached over http) or
// etcd+https://... (over TLS) into endpoints and a prefix. It is the
// notation of `corrald store copy`.
func ParseURL(raw string) (endpoints []string, prefix string, err error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "etcd" && scheme != "etcd+https" && scheme != "etcd+http") {
		return nil, "", apierr.Invalidf("store address %q: want etcd://HOST:PORT[,HOST:PORT...][/PREFIX] or etcd+https://...", raw)
	}
	hosts, path, _ := strings.Cut(rest, "/")
	member := "http"
	if scheme == "etcd+https" {
		member = "https"
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return nil, "", apierr.Invalidf("store address %q: empty member address", raw)
		}
		endpoints = append(endpoints, member+"://"+h)
	}
	prefix = DefaultPrefix
	if path != "" {
		prefix = "/" + strings.TrimSuffix(path, "/")
	}
	return endpoints, prefix, nil
}

// Open connects to the cluster and checks that it answers (a read of the
// prefix), so a wrong address fails at start with a clear error rather than
// at the first request.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	tlsCfg, err := opts.tlsConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   opts.Endpoints,
		DialTimeout: opts.DialTimeout,
		TLS:         tlsCfg,
		// The client's warnings and errors go to the store's logger;
		// failures also surface as errors from the calls that hit them.
		Logger:               newZapLogger(opts.Logger, clientLogLevel),
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		AutoSyncInterval:     time.Minute,
		RejectOldCluster:     false,
		// etcd refuses pings on a connection without streams ("too many
		// pings"); watches keep a stream open where it matters.
		PermitWithoutStream: false,
	})
	if err != nil {
		return nil, apierr.Unavailablef("store/etcd: connect to %s: %v", strings.Join(opts.Endpoints, ","), err)
	}
	// Every key is stored as Prefix + "/" + key: the separator keeps one
	// fleet's keys apart from a fleet whose prefix extends this one's
	// ("/corral" and "/corralx"), whatever the keys look like.
	s := &Store{cli: cli, prefix: opts.Prefix + "/", opts: opts, log: opts.Logger,
		adm: newAdmission(opts.MaxInFlight, opts.MaxQueued, opts.AdmitWait, opts.RequestTimeout/5, opts.Logger)}
	s.base, s.stop = context.WithCancel(context.Background())
	cctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	if _, err := cli.Get(cctx, opts.Prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, apierr.Unavailablef("store/etcd: cluster %s did not answer: %v", strings.Join(opts.Endpoints, ","), err)
	}
	return s, nil
}

func (o *Options) fill() error {
	if len(o.Endpoints) == 0 {
		return apierr.Invalidf("store/etcd: no endpoints (--etcd-endpoints)")
	}
	for _, e := range o.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return apierr.Invalidf("store/etcd: endpoint %q: want http://HOST:PORT or https://HOST:PORT", e)
		}
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if !strings.HasPrefix(o.Prefix, "/") || strings.HasSuffix(o.Prefix, "/") {
		return apierr.Invalidf("store/etcd: prefix %q must start with / and not end with one", o.Prefix)
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return apierr.Invalidf("store/etcd: a client certificate needs both --etcd-cert and --etcd-key")
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.UpdateAttempts <= 0 {
		o.UpdateAttempts = DefaultUpdateAttempts
	}
	if o.WatchBuffer <= 0 {
		o.WatchBuffer = DefaultWatchBuffer
	}
	switch {
	case o.MaxInFlight < 0 || (o.MaxInFlight > 0 && o.MaxInFlight < minInFlight):
		return apierr.Invalidf("store/etcd: --etcd-max-in-flight %d: want at least %d (0: the default, %d)", o.MaxInFlight, minInFlight, DefaultMaxInFlight)
	case o.MaxQueued < 0:
		return apierr.Invalidf("store/etcd: --etcd-max-queued %d: want 0 (the default, %d) or more", o.MaxQueued, DefaultMaxQueued)
	case o.AdmitWait < 0:
		return apierr.Invalidf("store/etcd: --etcd-admit-wait %s: want 0 (the request timeout) or more", o.AdmitWait)
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = DefaultMaxQueued
	}
	if o.AdmitWait <= 0 {
		o.AdmitWait = o.RequestTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// tlsConfig is nil (plain) unless a file or an https:// endpoint asks for TLS.
func (o *Options) tlsConfig() (*tls.Config, error) {
	https := false
	for _, e := range o.Endpoints {
		https = https || strings.HasPrefix(e, "https://")
	}
	if o.CAFile == "" && o.CertFile == "" && !https {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, apierr.Invalidf("store/etcd: --etcd-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, apierr.Invalidf("store/etcd: --etcd-ca %s: no PEM certificate in it", o.CAFile)
		}
		c.RootCAs = pool
	}
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, apierr.Invalidf("store/etcd: --etcd-cert/--etcd-key: %v", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// Client is the etcd client, for the cluster's leases and elections
// (internal/cluster). Callers must not write below the store's prefix
// except through the store.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Prefix is the key prefix this store writes under.
func (s *Store) Prefix() string { return s.opts.Prefix }

// Endpoints are the members the store was opened with.
func (s *Store) Endpoints() []string { return s.opts.Endpoints }

func (s *Store) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	return nil
}

// reqCtx bounds one request.
func (s *Store) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.RequestTimeout)
}

// wrap turns an etcd error into the store's vocabulary. A request that ran
// out of time while the caller's context is alive means the cluster did not
// answer (no quorum, no member reachable).
func (s *Store) wrap(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("store/etcd: %s %s: %w", op, key, ctx.Err())
	}
	if s.enter() != nil {
		return store.ErrClosed
	}
	switch {
	case timedOut(err):
		return apierr.Unavailablef("store/etcd: %s %s: the etcd cluster did not answer within %s (quorum lost or no member reachable)", op, key, s.opts.RequestTimeout)
	case errors.Is(err, rpctypes.ErrGRPCRequestTooLarge), errors.Is(err, rpctypes.ErrRequestTooLarge):
		return apierr.Exhaustedf("store/etcd: %s %s: value too large for etcd's request limit: %v", op, key, err)
	case errors.Is(err, rpctypes.ErrGRPCCompacted), errors.Is(err, rpctypes.ErrCompacted):
		return apierr.Preconditionf("store/etcd: %s %s: %v", op, key, err)
	}
	return apierr.Unavailablef("store/etcd: %s %s: %v", op, key, err)
}

// timedOut reports whether err is a request that ran out of time. The etcd
// client does not always wrap the context's error: a member that gave up
// waiting for quorum answers a gRPC status carrying the text.
func timedOut(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Canceled:
		return true
	default: // a plain error, or a status whose code lost the deadline
		return strings.Contains(err.Error(), context.DeadlineExceeded.Error())
	}
}

func kvOf(prefix string, kv *mvccpb.KeyValue) store.KV {
	return store.KV{Key: strings.TrimPrefix(string(kv.Key), prefix), Value: kv.Value, Revision: kv.ModRevision}
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	if err := s.enter(); err != nil {
		return store.KV{}, err
	}
	var resp *clientv3.GetResponse
	var opts []clientv3.OpOption
	if store.LocalReads(ctx) {
		opts = append(opts, clientv3.WithSerializable())
	}
	err := s.do(ctx, "get", key, func(rctx context.Context) (err error) {
		resp, err = s.cli.Get(rctx, s.prefix+key, opts...)
		return err
	})
	if err != nil {
		return store.KV{}, err
	}
	if len(resp.Kvs) == 0 {
		return store.KV{}, fmt.Errorf("%s: %w", key, store.ErrNotFound)
	}
	return kvOf(s.prefix, resp.Kvs[0]), nil
}

// List implements store.Store. Long results are read in pages at one
// revision, so they are one consistent snapshot.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KV, error) {
	kvs, _, err := s.ListRevision(ctx, prefix)
	return kvs, err
}

// ListRevision implements store.HistoryWatcher: the revision is the
// cluster's revision the first page was read at (every page is read at
// it).
func (s *Store) ListRevision(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	if err := s.enter(); err != nil {
		return nil, 0, err
	}
	full := s.prefix + prefix
	end := clientv3.GetPrefixRangeEnd(full)
	out := []store.KV{}
	from, rev := full, int64(0)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		var resp *clientv3.GetResponse
		err := s.do(ctx, "list", prefix, func(rctx context.Context) (err error) {
			resp, err = s.cli.Get(rctx, from, opts...)
			return err
		})
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			out = append(out, kvOf(s.prefix, kv))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// cmp is the compare-and-swap precondition for rev.
func cmpRev(key string, rev int64) clientv3.Cmp {
	if rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(key), "=", rev)
}

// Put implements store.Store (as one unit of a group commit: group.go).
func (s *Store) Put(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if rev < 0 {
		return 0, fmt.Errorf("%s: revision %d: %w", key, rev, store.ErrConflict)
	}
	return s.commit(ctx, &unit{op: "put", keys: []string{key}, revs: []int64{rev}, kinds: []store.OpKind{store.OpPut}, vals: []string{string(value)}})
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string, rev int64) error {
	_, err := s.delete(ctx, key, rev)
	return err
}

// delete is Delete returning the delete's revision (a unit of a group
// commit: group.go).
func (s *Store) delete(ctx context.Context, key string, rev int64) (int64, error) {
	if rev <= 0 {
		if err := s.enter(); err != nil {
			return 0, err
		}
		if _, err := s.Get(ctx, key); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%s: %w", key, store.ErrConflict)
	}
	return s.commit(ctx, &unit{op: "delete", keys: []string{key}, revs: []int64{rev}, kinds: []store.OpKind{store.OpDelete}, vals: []string{""}})
}

// Txn implements store.Store's transaction as one etcd transaction: If
// every key's mod revision equals its op's revision (create revision 0 for
// revision 0), Then the puts and deletes in order, Else a read of every
// key, from which the first failing key is named. The writes get etcd's
// one revision of the transaction, and its watch delivers them in order;
// a transaction of checks only is a read and returns the cluster's
// revision.
func (s *Store) Txn(ctx context.Context, ops []store.Op) (int64, error) {
	if err := store.CheckTxn(ops); err != nil {
		return 0, fmt.Errorf("store/etcd: txn: %w", err)
	}
	u := &unit{op: "txn"}
	writes := false
	for _, o := range ops {
		u.keys = append(u.keys, o.Key)
		u.revs = append(u.revs, o.Rev)
		u.kinds = append(u.kinds, o.Kind)
		u.vals = append(u.vals, string(o.Value))
		writes = writes || o.Kind != store.OpCheck
	}
	if writes {
		return s.commit(ctx, u)
	}
	return s.checkOnly(ctx, u)
}

// checkOnly is a transaction of checks only: a read at one revision,
// returning the cluster's revision.
func (s *Store) checkOnly(ctx context.Context, u *unit) (int64, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	cmps := make([]clientv3.Cmp, 0, len(u.keys))
	reads := make([]clientv3.Op, 0, len(u.keys))
	for i, key := range u.keys {
		k := s.prefix + key
		cmps = append(cmps, cmpRev(k, u.revs[i]))
		reads = append(reads, clientv3.OpGet(k, clientv3.WithKeysOnly()))
	}
	var resp *clientv3.TxnResponse
	err := s.do(ctx, "txn", fmt.Sprintf("%s (%d operations)", u.keys[0], len(u.keys)), func(rctx context.Context) (err error) {
		resp, err = s.cli.Txn(rctx).If(cmps...).Else(reads...).Commit()
		return err
	})
	if err != nil {
		return 0, err
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	if err := u.judge(resp.Responses); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("store/etcd: txn: a precondition of %q and %d more failed: %w", u.keys[0], len(u.keys)-1, store.ErrConflict)
}

// Update implements store.Updater as a bounded read-compare-swap loop.
// Updates of one key from this process take turns (a striped lock), so
// they conflict only with other appliances' writes: many writers of a hot
// record in one appliance (a network's addresses, a node's budget) do not
// spin against each other.
func (s *Store) Update(ctx context.Context, key string, fn func(cur store.KV, exists bool) ([]byte, bool, error)) (store.KV, error) {
	mu := &s.stripes[stripeOf(key)]
	mu.Lock()
	defer mu.Unlock()
	pause := conflictBackoff()
	for attempt := 0; attempt < s.opts.UpdateAttempts; attempt++ {
		cur, err := s.Get(ctx, key)
		exists := err == nil
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return store.KV{}, err
		}
		v, del, err := fn(cur, exists)
		if err != nil {
			return store.KV{}, err
		}
		switch {
		case del && !exists:
			return store.KV{}, fmt.Errorf("%s: %w", key, store.ErrNotFound)
		case del:
			var drev int64
			drev, err = s.delete(ctx, key, cur.Revision)
			if err == nil {
				return store.KV{Key: key, Revision: drev}, nil
			}
			if errors.Is(err, store.ErrNotFound) {
				err = store.ErrConflict
			}
		default:
			rev := cur.Revision
			if !exists {
				rev = 0
			}
			var nrev int64
			nrev, err = s.Put(ctx, key, v, rev)
			if err == nil {
				return store.KV{Key: key, Value: append([]byte(nil), v...), Revision: nrev}, nil
			}
		}
		if !errors.Is(err, store.ErrConflict) {
			return store.KV{}, err
		}
		if err := sleep(ctx, pause.NextBackOff()+50*time.Microsecond); err != nil {
			return store.KV{}, err
		}
	}
	return store.KV{}, fmt.Errorf("%s: %d attempts lost to concurrent writers: %w", key, s.opts.UpdateAttempts, store.ErrConflict)
}

// updateStripes is how many locks Updates of different keys spread over.
const updateStripes = 64

func stripeOf(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % updateStripes)
}

// conflictBackoff gives the pauses (before 50 µs more) between the
// attempts of one Update: random, uniform up to 500 µs and doubling to at
// most 16 ms.
func conflictBackoff() backoff.ExponentialBackOff {
	return backoff.ExponentialBackOff{InitialInterval: 250 * time.Microsecond, RandomizationFactor: 1, Multiplier: 2, MaxInterval: 8 * time.Millisecond}
}

// sleep waits d or until ctx ends, whose error it returns.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Watch implements store.Store. The watch starts just after the cluster's
// current revision, read when Watch is called, so it sees every change that
// commits after Watch returns. A watcher more than WatchBuffer events
// behind, or whose start was compacted away, is disconnected.
func (s *Store) Watch(ctx context.Context, prefix string) (<-chan store.Event, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	var resp *clientv3.GetResponse
	err := s.do(ctx, "watch", prefix, func(rctx context.Context) (err error) {
		resp, err = s.cli.Get(rctx, s.prefix+prefix, clientv3.WithCountOnly())
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.watchAfter(ctx, prefix, resp.Header.Revision)
}

// Revision implements store.HistoryWatcher: the cluster's revision (shared
// with anything else stored on the cluster).
func (s *Store) Revision(ctx context.Context) (int64, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	var resp *clientv3.GetResponse
	err := s.do(ctx, "revision", "", func(rctx context.Context) (err error) {
		resp, err = s.cli.Get(rctx, s.prefix, clientv3.WithCountOnly())
		return err
	})
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// WatchFrom implements store.HistoryWatcher on etcd's own history: a
// revision etcd has compacted away, or one beyond the cluster's current
// revision, is refused with store.ErrCompacted naming etcd's compaction
// point. A watch that etcd cancels later (compacted while it lagged) is
// closed; resuming it then reports the compaction.
func (s *Store) WatchFrom(ctx context.Context, prefix string, afterRev int64) (<-chan store.Event, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(rctx, s.prefix+prefix, clientv3.WithCountOnly())
	if err != nil {
		return nil, s.wrap(ctx, "watch", prefix, err)
	}
	cur := resp.Header.Revision
	if afterRev > cur || afterRev < 0 {
		return nil, fmt.Errorf("store/etcd: watch %s: revision %d is beyond the cluster's current revision %d; re-list with from_revision 0: %w", prefix, afterRev, cur, store.ErrCompacted)
	}
	if afterRev < cur {
		// A read at afterRev+1 fails exactly when a watch from there would.
		_, err := s.cli.Get(rctx, s.prefix+prefix, clientv3.WithCountOnly(), clientv3.WithRev(afterRev+1))
		if errors.Is(err, rpctypes.ErrGRPCCompacted) || errors.Is(err, rpctypes.ErrCompacted) {
			return nil, fmt.Errorf("store/etcd: watch %s: revision %d is compacted: %s; re-list with from_revision 0: %w", prefix, afterRev, s.compactedAt(ctx, prefix, afterRev), store.ErrCompacted)
		}
		if err != nil {
			return nil, s.wrap(ctx, "watch", prefix, err)
		}
	}
	return s.watchAfter(ctx, prefix, afterRev)
}

// compactedAt asks etcd for its compaction revision (a watch from a
// compacted revision is answered with it) and describes it.
func (s *Store) compactedAt(ctx context.Context, prefix string, afterRev int64) string {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for wr := range s.cli.Watch(pctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithRev(afterRev+1)) {
		if wr.CompactRevision != 0 {
			// etcd keeps revisions >= its compaction point: a watch may
			// resume after the revision before it.
			return fmt.Sprintf("the oldest revision this store can resume from is %d", wr.CompactRevision-1)
		}
		if wr.Err() != nil {
			break
		}
	}
	return "etcd no longer keeps the history after it"
}

// watchAfter starts a watch of every change after rev.
func (s *Store) watchAfter(ctx context.Context, prefix string, rev int64) (<-chan store.Event, error) {
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	stop := context.AfterFunc(s.base, wcancel)
	wch := s.cli.Watch(wctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	out := make(chan store.Event, s.opts.WatchBuffer)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		stop()
		wcancel()
		return nil, store.ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer stop()
		defer wcancel()
		for wr := range wch {
			if err := wr.Err(); err != nil {
				if wctx.Err() == nil {
					s.log.Warn("etcd watch ended; the watcher is disconnected", "prefix", prefix, "err", err)
				}
				return
			}
			for i, ev := range wr.Events {
				// A watcher that falls behind is cut between revisions,
				// never inside one: it resumes after the last revision it
				// saw (WatchFrom) and would otherwise miss the rest of a
				// transaction's, or a group commit's, events.
				if i == 0 || ev.Kv.ModRevision != wr.Events[i-1].Kv.ModRevision {
					n := 1
					for _, next := range wr.Events[i+1:] {
						if next.Kv.ModRevision != ev.Kv.ModRevision {
							break
						}
						n++
					}
					if cap(out)-len(out) < n {
						s.log.Warn("store watcher fell behind; disconnected", "prefix", prefix, "buffer", s.opts.WatchBuffer)
						return
					}
				}
				e := store.Event{Type: store.EventPut, KV: kvOf(s.prefix, ev.Kv)}
				if ev.Type == clientv3.EventTypeDelete {
					e.Type = store.EventDelete
					e.KV.Value = nil
					e.KV.Revision = ev.Kv.ModRevision
				}
				out <- e // room checked above; only this goroutine sends
			}
		}
	}()
	return out, nil
}

// Close implements store.Store: it ends every watcher and closes the client.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
	return s.cli.Close()
}
