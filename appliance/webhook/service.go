package webhook

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// MaxReceivers bounds the receivers one appliance (or fleet) keeps.
const MaxReceivers = 64

// maxCAPEM bounds a receiver's CA file.
const maxCAPEM = 64 << 10

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Sealer seals and opens the receivers' secrets (ipmi/seal's Sealer);
// the associated data binds a blob to its receiver's name.
type Sealer interface {
	Seal(plaintext, ad []byte) ([]byte, error)
	Open(blob, ad []byte) ([]byte, error)
}

// Service keeps receivers in the store: one record per name, written by
// compare-and-swap. Safe for concurrent use.
type Service struct {
	st     store.Store
	sealer Sealer
	guard  Guard
	log    *slog.Logger
	now    func() time.Time
}

// NewService returns the receivers' service.
func NewService(st store.Store, sealer Sealer, guard Guard, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{st: st, sealer: sealer, guard: guard, log: log, now: time.Now}
}

func sealAD(name string) []byte { return []byte("webhook/" + name) }

// Add checks and stores a receiver with a new secret and returns it with
// the printed secret (never stored in the clear, never shown again).
func (s *Service) Add(ctx context.Context, req *webhookv1.AddWebhookRequest) (*webhookv1.Receiver, string, error) {
	name := req.GetName()
	if name == "" {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, "", err
		}
		name = "wh-" + hex.EncodeToString(b[:])
	}
	if !nameRE.MatchString(name) {
		return nil, "", apierr.Invalidf("webhook name %q: use 1-63 lower-case letters, digits or '-'", name)
	}
	if _, err := s.guard.CheckURL(req.GetUrl(), req.GetAllowInsecure(), req.GetAllowBootLan()); err != nil {
		return nil, "", apierr.Invalidf("%v", err)
	}
	events, err := checkEvents(req.GetEvents())
	if err != nil {
		return nil, "", err
	}
	if len(req.GetCaPem()) > 0 {
		if len(req.GetCaPem()) > maxCAPEM {
			return nil, "", apierr.Invalidf("CA file of %d bytes (at most %d)", len(req.GetCaPem()), maxCAPEM)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(req.GetCaPem()) {
			return nil, "", apierr.Invalidf("CA file holds no PEM certificate")
		}
	}
	existing, err := s.st.List(ctx, store.WebhooksPrefix)
	if err != nil {
		return nil, "", err
	}
	if len(existing) >= MaxReceivers {
		return nil, "", apierr.Exhaustedf("%d webhook receivers exist (at most %d)", len(existing), MaxReceivers)
	}
	key, printed, err := NewSecret()
	if err != nil {
		return nil, "", err
	}
	sealed, err := s.sealer.Seal(key, sealAD(name))
	if err != nil {
		return nil, "", err
	}
	r := &webhookv1.Receiver{Name: name, Url: req.GetUrl(), Events: events, AllowInsecure: req.GetAllowInsecure(),
		AllowBootLan: req.GetAllowBootLan(), CaPem: req.GetCaPem(), CreatedAt: timestamppb.New(s.now()), SealedSecret: sealed}
	if _, err := record.Put(ctx, s.st, store.WebhooksPrefix+name, r, 0); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, "", apierr.Existsf("webhook %q exists", name)
		}
		return nil, "", err
	}
	s.log.Info("webhook receiver added", "webhook", name, "events", strings.Join(events, ","))
	return public(r), printed, nil
}

func checkEvents(in []string) ([]string, error) {
	var out []string
	for _, e := range in {
		for _, e := range strings.Split(e, ",") {
			e = strings.TrimSpace(e)
			if e == "" {
				continue
			}
			if !slices.Contains(Classes, e) {
				return nil, apierr.Invalidf("event class %q: want %s", e, strings.Join(Classes, ", "))
			}
			if !slices.Contains(out, e) {
				out = append(out, e)
			}
		}
	}
	if len(out) == 0 {
		return nil, apierr.Invalidf("no event class: want one or more of %s", strings.Join(Classes, ", "))
	}
	return out, nil
}

// public is r without its sealed secret.
func public(r *webhookv1.Receiver) *webhookv1.Receiver {
	c := proto.Clone(r).(*webhookv1.Receiver)
	c.SealedSecret = nil
	return c
}

// List returns one page of receivers in name order, without secrets.
func (s *Service) List(ctx context.Context, size int32, token string) ([]*webhookv1.Receiver, string, error) {
	rs, err := record.List(ctx, s.st, store.WebhooksPrefix, func() *webhookv1.Receiver { return &webhookv1.Receiver{} })
	if err != nil {
		return nil, "", err
	}
	page, next, err := paging.Slice(rs, (*webhookv1.Receiver).GetName, size, token, paging.Fingerprint("webhooks"))
	if err != nil {
		return nil, "", err
	}
	out := make([]*webhookv1.Receiver, len(page))
	for i, r := range page {
		out[i] = public(r)
	}
	return out, next, nil
}

// Remove deletes a receiver.
func (s *Service) Remove(ctx context.Context, name string) error {
	if !nameRE.MatchString(name) {
		return apierr.Invalidf("webhook name %q is malformed", name)
	}
	_, err := record.Update(ctx, s.st, store.WebhooksPrefix+name, func() *webhookv1.Receiver { return &webhookv1.Receiver{} },
		func(_ *webhookv1.Receiver, exists bool) (bool, error) {
			if !exists {
				return false, apierr.NotFoundf("webhook %q not found", name)
			}
			return true, nil
		})
	if err == nil {
		s.log.Info("webhook receiver removed", "webhook", name)
		// Its cursor goes too: a receiver added later under the name
		// starts from its own creation.
		s.dropCursor(ctx, name)
	}
	return err
}

// Enable resumes a receiver that was cut off: its cut_at and cut_reason
// are cleared (the overflow count stays), so the leader's dispatcher
// serves it again from the events after this change, with its URL and
// secret unchanged. Its delivery cursor goes too, so that a leader
// taking over later does not replay what was dropped during the cut. It
// also clears a "history lost" note. A receiver with neither is a
// precondition error.
func (s *Service) Enable(ctx context.Context, name string) (*webhookv1.Receiver, error) {
	if !nameRE.MatchString(name) {
		return nil, apierr.Invalidf("webhook name %q is malformed", name)
	}
	var out *webhookv1.Receiver
	var wasCut bool
	_, err := record.Update(ctx, s.st, store.WebhooksPrefix+name, func() *webhookv1.Receiver { return &webhookv1.Receiver{} },
		func(r *webhookv1.Receiver, exists bool) (bool, error) {
			if !exists {
				return false, apierr.NotFoundf("webhook %q not found", name)
			}
			if r.GetCutAt() == nil && r.GetCutReason() == "" {
				return false, apierr.Preconditionf("webhook %q is not cut off", name)
			}
			wasCut = r.GetCutAt() != nil
			r.CutAt, r.CutReason = nil, ""
			out = r
			return false, nil
		})
	if err != nil {
		return nil, err
	}
	s.log.Info("webhook receiver enabled", "webhook", name, "was_cut_off", wasCut, "overflowed", out.GetOverflowed())
	s.dropCursor(ctx, name)
	return public(out), nil
}

// dropCursor deletes name's delivery cursor, if any (a failure is logged:
// the receiver's record changed already).
func (s *Service) dropCursor(ctx context.Context, name string) {
	_, err := record.Update(ctx, s.st, cursorKey(name), func() *webhookv1.DeliveryCursor { return &webhookv1.DeliveryCursor{} },
		func(*webhookv1.DeliveryCursor, bool) (bool, error) { return true, nil })
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("webhook: remove the delivery cursor", "webhook", name, "err", err)
	}
}

// secret opens r's sealed secret.
func (s *Service) secret(r *webhookv1.Receiver) ([]byte, error) {
	k, err := s.sealer.Open(r.GetSealedSecret(), sealAD(r.GetName()))
	if err != nil {
		return nil, fmt.Errorf("webhook %s: secret: %w", r.GetName(), err)
	}
	return k, nil
}

// Register serves WebhookService on srv.
func (s *Service) Register(srv *grpc.Server) {
	webhookv1.RegisterWebhookServiceServer(srv, server{s: s})
}

// server is WebhookService, the gRPC edge of a Service: errors become
// status codes here only (apierr.ToStatus).
type server struct {
	webhookv1.UnimplementedWebhookServiceServer
	s *Service
}

func (g server) AddWebhook(ctx context.Context, req *webhookv1.AddWebhookRequest) (*webhookv1.AddWebhookResponse, error) {
	r, secret, err := g.s.Add(ctx, req)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &webhookv1.AddWebhookResponse{Receiver: r, Secret: secret}, nil
}

func (g server) ListWebhooks(ctx context.Context, req *webhookv1.ListWebhooksRequest) (*webhookv1.ListWebhooksResponse, error) {
	rs, next, err := g.s.List(ctx, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &webhookv1.ListWebhooksResponse{Receivers: rs, NextPageToken: next}, nil
}

func (g server) RemoveWebhook(ctx context.Context, req *webhookv1.RemoveWebhookRequest) (*webhookv1.RemoveWebhookResponse, error) {
	if err := g.s.Remove(ctx, req.GetName()); err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &webhookv1.RemoveWebhookResponse{}, nil
}

func (g server) EnableWebhook(ctx context.Context, req *webhookv1.EnableWebhookRequest) (*webhookv1.EnableWebhookResponse, error) {
	r, err := g.s.Enable(ctx, req.GetName())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &webhookv1.EnableWebhookResponse{Receiver: r}, nil
}
