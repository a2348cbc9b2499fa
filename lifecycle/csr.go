package lifecycle

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The node key is made on the machine (docs/security.md, "Node identity"): the install plan carries no
// key material; the discovery agent sends a CertificateRequest for the
// install id on its session, and the appliance signs it, for the
// accepted name only, when
//   - the request parses: at most MaxCSRBytes of PEM, one PKCS#10
//     request whose signature checks, with an ECDSA P-256/P-384, Ed25519
//     or RSA (2048 bits or more) key;
//   - it came on the agent stream the current install plan was sent on
//     (plans go only to the session of the agent that registered with the
//     machine's identity; a plan resent on a new session moves the
//     binding there);
//   - the machine is INSTALLING with that install id, the install not
//     done (a superseded, failed or timed-out install is not INSTALLING
//     with that id any more);
//   - it is the install's first key, or the same key again (an answer
//     lost with its session: signed again, once per session). A different
//     key is refused, the machine flagged (FlagCSRKeyConflict) and every
//     certificate issued for its name revoked (Config.Certs): an install
//     has one node key, and whoever holds the other one must not keep a
//     certificate for the name. The install then fails; accepting the
//     machine again starts a new install with a new key.
//
// The name is the machine's: the request's subject and SANs are ignored
// (NodeIdentity.SignNode decides them). Every refusal is a NodeCertificate
// with the reason, a timeline entry and a log line (those two
// rate-limited across the agent edge, as its other refusals are).

// MaxCSRBytes caps a CertificateRequest's PEM. A P-256 request is about
// 400 bytes and an RSA-4096 one under 2 KiB: this is a bound on the
// format, not a capacity to tune (gRPC's message limit comes first).
const MaxCSRBytes = 8 << 10

// FlagCSRKeyConflict starts the machine flag set when an install's agent
// asks to sign a second, different node key.
const FlagCSRKeyConflict = "csr-key-conflict"

// AnnotationNodeKey records the node key signed for the machine's latest
// install: "<install id> sha256:<hex of the public key's DER>".
const AnnotationNodeKey = "corral/node_key"

// parseCSR checks a CertificateRequest's PEM: size, one PEM block of type
// CERTIFICATE REQUEST and nothing else, a request whose signature checks,
// an accepted key type. It returns the request and the key fingerprint;
// an error is of class apierr.ErrInvalid.
func parseCSR(csrPEM []byte) (*x509.CertificateRequest, string, error) {
	if len(csrPEM) > MaxCSRBytes {
		return nil, "", apierr.Invalidf("certificate request: %d bytes; the limit is %d", len(csrPEM), MaxCSRBytes)
	}
	block, rest := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, "", apierr.Invalidf("certificate request: no PEM CERTIFICATE REQUEST block")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, "", apierr.Invalidf("certificate request: data after the PEM CERTIFICATE REQUEST block")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, "", apierr.Invalidf("certificate request: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, "", apierr.Invalidf("certificate request: bad signature: %v", err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, "", apierr.Invalidf("certificate request: ECDSA curve %s: want P-256 or P-384", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, "", apierr.Invalidf("certificate request: RSA key of %d bits: want 2048 or more", k.N.BitLen())
		}
	default:
		return nil, "", apierr.Invalidf("certificate request: key type %T: want ECDSA, Ed25519 or RSA", k)
	}
	sum := sha256.Sum256(csr.RawSubjectPublicKeyInfo)
	return csr, "sha256:" + hex.EncodeToString(sum[:]), nil
}

// planStreams ties install plans to the agent stream they were sent on.
// A stream is known by its context (the Session handler passes the same
// stream context to onConnect and onCSR). Entries live while their stream
// does: at most two per connected agent, removed when the stream ends.
type planStreams struct {
	mu   sync.Mutex
	cur  map[string]context.Context // machine → the stream that attached last
	sent map[string]planSent        // machine → the plan sent on a stream
}

type planSent struct {
	installID string
	stream    context.Context
	signed    bool // a certificate was signed on this stream
}

// attached notes that machine's agent stream stream attached (onConnect,
// before anything is sent on it) and forgets it when it ends.
func (p *planStreams) attached(stream context.Context, machine string) {
	p.mu.Lock()
	if p.cur == nil {
		p.cur, p.sent = map[string]context.Context{}, map[string]planSent{}
	}
	p.cur[machine] = stream
	p.mu.Unlock()
	context.AfterFunc(stream, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cur[machine] == stream {
			delete(p.cur, machine)
		}
		if p.sent[machine].stream == stream {
			delete(p.sent, machine)
		}
	})
}

// planSentNow records that install id's plan went to machine's current
// stream.
func (p *planStreams) planSentNow(machine, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.cur[machine]; ok && s.Err() == nil {
		p.sent[machine] = planSent{installID: id, stream: s}
	}
}

// check says why a CSR for install id on stream may not be signed, or "",
// and whether a certificate was signed on stream for it already.
func (p *planStreams) check(stream context.Context, machine, id string) (why string, signed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.sent[machine]
	if !ok || s.installID != id || s.stream != stream {
		return fmt.Sprintf("install plan %s was not sent on this session", id), false
	}
	return "", s.signed
}

// signedOn marks install id's certificate signed on stream.
func (p *planStreams) signedOn(stream context.Context, machine, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.sent[machine]; ok && s.installID == id && s.stream == stream {
		s.signed = true
		p.sent[machine] = s
	}
}

// csrOutcome is what the CSR's machine mutation decided.
type csrOutcome int

const (
	csrRefused  csrOutcome = iota
	csrFirst               // the install's first key: recorded
	csrSameKey             // the key signed before for this install
	csrConflict            // another key: refused, machine flagged
)

// onCSR answers a discovery agent's CertificateRequest on its session
// (stream is the session's stream context): it signs the request for the
// machine's name when the rules above hold, in one machine mutation, and
// answers with a NodeCertificate either way.
func (l *Lifecycle) onCSR(stream context.Context, machine string, req *nodev1.CertificateRequest) {
	ctx := context.WithoutCancel(stream)
	id := req.GetInstallId()
	csrPEM := []byte(req.GetCsrPem())
	if id == "" {
		l.refuseCSR(ctx, machine, id, "certificate request without an install_id")
		return
	}
	_, fp, err := parseCSR(csrPEM)
	if err != nil {
		l.refuseCSR(ctx, machine, id, err.Error())
		return
	}
	why, signedHere := l.streams.check(stream, machine, id)
	if why != "" {
		l.refuseCSR(ctx, machine, id, why)
		return
	}
	now := timestamppb.New(l.now())
	var out csrOutcome
	var prior string
	m, err := l.updateMachineRetrying(ctx, machine, func(m *inventoryv1.Machine) error {
		out, why, prior = csrRefused, "", ""
		in := m.GetInstall()
		switch {
		case m.GetState() != inventoryv1.Machine_INSTALLING:
			why = fmt.Sprintf("machine %q is %s, not INSTALLING", machine, m.GetState())
			return errSkip
		case in.GetInstallId() != id:
			why = fmt.Sprintf("install %q is not machine %q's current install", id, machine)
			return errSkip
		case in.GetDone():
			why = fmt.Sprintf("install %s is done: its identity is written", id)
			return errSkip
		}
		conflictOf := FlagCSRKeyConflict + ": install " + id + ":"
		if slices.ContainsFunc(m.GetFlags(), func(f string) bool { return strings.HasPrefix(f, conflictOf) }) {
			why = fmt.Sprintf("install %s had a second node key asked for: nothing more is signed for it; accept the machine again to install anew", id)
			return errSkip
		}
		recID, recKey, _ := strings.Cut(m.GetAnnotations()[AnnotationNodeKey], " ")
		switch {
		case recID != id:
			out = csrFirst
			if m.Annotations == nil {
				m.Annotations = map[string]string{}
			}
			m.Annotations[AnnotationNodeKey] = id + " " + fp
			m.Flags = slices.DeleteFunc(m.Flags, func(f string) bool { return strings.HasPrefix(f, FlagCSRKeyConflict) })
			in.UpdatedAt = now
			return nil
		case recKey == fp:
			out = csrSameKey
			return errSkip // nothing to write
		default:
			out, prior = csrConflict, recKey
			flag := fmt.Sprintf("%s %s was signed, then %s was asked for", conflictOf, recKey, fp)
			m.Flags = append(slices.DeleteFunc(m.Flags, func(f string) bool { return strings.HasPrefix(f, FlagCSRKeyConflict) }), flag)
			return nil
		}
	})
	if err != nil && !errors.Is(err, errSkip) {
		l.log.Warn("certificate request not recorded", "machine", machine, "install_id", id, "err", err)
		l.refuseCSR(ctx, machine, id, "the appliance could not record the request: "+err.Error())
		return
	}
	switch out {
	case csrRefused:
		l.refuseCSR(ctx, machine, id, why)
		return
	case csrConflict:
		reason := fmt.Sprintf("install %s already has a node key (%s); this request is for another (%s): one key per install; accept the machine again to install anew", id, prior, fp)
		if m != nil {
			if err := l.revokeCerts(ctx, m, fmt.Sprintf("install %s: a second node key was asked for", id)); err != nil {
				l.log.Error("node certificates not revoked after a key conflict", "machine", machine, "install_id", id, "err", err)
				reason += "; revoking the certificates already issued for it failed: " + err.Error()
			} else if l.cfg.Certs != nil {
				reason += "; the certificates already issued for it are revoked"
			}
		}
		l.refuseCSR(ctx, machine, id, reason)
		return
	case csrSameKey:
		if signedHere {
			l.refuseCSR(ctx, machine, id, fmt.Sprintf("a certificate for install %s was already signed on this session", id))
			return
		}
	case csrFirst:
		// The install's first key, recorded: signed below.
	}
	var certPEM []byte
	err = l.retryStore(ctx, machine, func() (err error) {
		certPEM, err = l.cfg.Identity.SignNode(ctx, machine, csrPEM)
		return err
	})
	if err != nil {
		l.log.Error("node certificate not signed", "machine", machine, "install_id", id, "err", err)
		l.refuseCSR(ctx, machine, id, "the appliance could not sign it: "+err.Error())
		return
	}
	l.streams.signedOn(stream, machine, id)
	serial := certSerial(certPEM)
	again := ""
	if out == csrSameKey {
		again = " again (same key)"
	}
	detail := fmt.Sprintf("install %s: node key %s made on the machine; certificate serial %s for node %s signed%s", id, fp, serial, machine, again)
	if m == nil {
		m, _ = l.inv.GetMachine(ctx, machine)
	}
	if m != nil {
		l.event(m, "lifecycle", "certificate-signed", detail, map[string]string{"install_id": id, "key": fp, "serial": serial})
	}
	l.log.Info("node certificate signed", "machine", machine, "node", machine, "install_id", id, "key", fp, "serial", serial, "same_key", out == csrSameKey)
	if err := l.sess.send(machine, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Certificate{Certificate: &nodev1.NodeCertificate{
		InstallId: id, CertPem: string(certPEM), CaCertPem: string(l.cfg.Identity.CACertPEM()),
	}}}); err != nil {
		l.log.Warn("node certificate not delivered: the agent's session is gone", "machine", machine, "install_id", id)
	}
}

// refuseCSR records a refused certificate request and answers it with
// why. The log line and the timeline entry go through the agent edge's
// rate limits (warn, noteGate: a flood of requests cannot flood the log
// or the store; the next log line counts what was dropped).
func (l *Lifecycle) refuseCSR(ctx context.Context, machine, id, why string) {
	l.warn("certificate request refused", "machine", machine, "install_id", id, "reason", why)
	if _, ok := l.sess.noteGate.Allow(); ok {
		if m, err := l.inv.GetMachine(ctx, machine); err == nil {
			l.event(m, "lifecycle", "csr-refused", why, map[string]string{"install_id": id})
		}
	}
	// The refusal is logged above; when the session is gone there is no one
	// left to answer, and the agent's request dies with it.
	_ = l.sess.send(machine, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Certificate{Certificate: &nodev1.NodeCertificate{InstallId: id, Error: why}}})
}

// certSerial is the serial of the first certificate in certPEM, in
// lowercase hex, or "?".
func certSerial(certPEM []byte) string {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return "?"
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "?"
	}
	return c.SerialNumber.Text(16)
}
