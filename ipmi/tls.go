package ipmi

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"sync"
	"time"
)

// TLSMode says how a Redfish BMC's TLS certificate is checked. IPMI
// (RMCP+) has no certificates and ignores it.
//
// A BMC's certificate is almost always self-signed: it chains to nothing,
// and its names are whatever the vendor put there. So the check is a pin:
// the SHA-256 of the leaf certificate's DER, compared on every handshake.
type TLSMode int

const (
	// TLSPinned (the zero value) accepts only the leaf certificate whose
	// SHA-256 is Target.TLSSHA256. Without a pin the Redfish provider is
	// not tried at all: credentials never go to an unverified peer.
	TLSPinned TLSMode = iota
	// TLSFirstUse trusts the certificate presented at the call's first
	// handshake (trust on first use, for enrolment) and only that one for
	// the rest of the call; Answer.TLSSHA256 reports it.
	TLSFirstUse
	// TLSInsecure does not check the certificate (an explicit opt-out).
	// Answer.TLSSHA256 still reports what was presented.
	TLSInsecure
)

func (m TLSMode) String() string {
	switch m {
	case TLSPinned:
		return "pinned"
	case TLSFirstUse:
		return "first-use"
	case TLSInsecure:
		return "insecure"
	}
	return fmt.Sprintf("tlsmode(%d)", int(m))
}

// ErrCertificate means a Redfish BMC presented a certificate other than the
// pinned one, or no certificate is pinned. Nothing was sent on the
// refused connection (the check runs in the TLS handshake, before any
// request). Errors of this class are *CertificateError.
var ErrCertificate = errors.New("BMC certificate not trusted")

// CertificateError is the error of a refused BMC certificate.
type CertificateError struct {
	// Pinned is the pinned SHA-256 (lowercase hex); empty when the BMC has
	// none (the Redfish provider was then not tried).
	Pinned string
	// Presented is the SHA-256 of the leaf certificate the BMC presented;
	// empty when no handshake got that far.
	Presented string
}

func (e *CertificateError) Error() string {
	if e.Pinned == "" {
		return "no certificate is pinned for this Redfish BMC"
	}
	return fmt.Sprintf("BMC certificate changed: pinned sha256 %s, presented %s", e.Pinned, cmp.Or(e.Presented, "none"))
}

// Unwrap makes errors.Is(err, ErrCertificate) hold.
func (e *CertificateError) Unwrap() error { return ErrCertificate }

// Fingerprint is the pin of a certificate: the lowercase hex SHA-256 of
// its DER encoding (what `openssl x509 -noout -fingerprint -sha256`
// prints, without the colons).
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// checkFingerprint accepts exactly 64 lowercase hex digits.
func checkFingerprint(s string) error {
	if len(s) != 2*sha256.Size {
		return fmt.Errorf("%w: TLS pin %q: want the 64 lowercase hex digits of a SHA-256", ErrInvalid, s)
	}
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return fmt.Errorf("%w: TLS pin %q: want the 64 lowercase hex digits of a SHA-256", ErrInvalid, s)
		}
	}
	return nil
}

// certCheck checks the leaf certificate of every TLS handshake of one
// session (one Controller call) against the target's policy and remembers
// what was presented and what was refused. Safe for concurrent handshakes.
type certCheck struct {
	mode TLSMode

	mu        sync.Mutex
	pinned    string // TLSPinned: the pin; TLSFirstUse: set by the first handshake
	presented string // the last leaf presented
	refused   *CertificateError
}

func newCertCheck(t Target) *certCheck {
	return &certCheck{mode: t.TLSMode, pinned: t.TLSSHA256}
}

// verify is the tls.Config.VerifyConnection hook. It runs on every
// handshake (resumed ones included), after the server's Finished and
// before a single request byte is written.
func (c *certCheck) verify(cs tls.ConnectionState) error {
	got := ""
	if len(cs.PeerCertificates) > 0 {
		got = Fingerprint(cs.PeerCertificates[0].Raw)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.presented = got
	switch {
	case c.mode == TLSInsecure:
		return nil
	case got == "":
		c.refused = &CertificateError{Pinned: c.pinned}
		return c.refused
	case c.mode == TLSFirstUse && c.pinned == "":
		c.pinned = got
		return nil
	case got != c.pinned:
		c.refused = &CertificateError{Pinned: c.pinned, Presented: got}
		return c.refused
	}
	return nil
}

// result returns the leaf presented last (empty when no handshake ran)
// and the refusal, if any.
func (c *certCheck) result() (presented string, refused *CertificateError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.presented, c.refused
}

// Bounds of the Redfish HTTP client. The call's deadline bounds each
// request as a whole (bmclib sets http.Client.Timeout from it); these
// keep one stuck phase from using all of it and cap what one session
// keeps open.
const (
	redfishDialTimeout      = 10 * time.Second
	redfishHandshakeTimeout = 10 * time.Second
	redfishIdleConns        = 2
)

// httpClient returns the HTTP client of one Redfish session: its own
// transport (so closing it closes only this session's connections), no
// proxy from the environment (a BMC network is reached directly), and a
// TLS config that skips chain verification — a BMC's self-signed
// certificate chains to nothing — and checks the leaf in verify instead.
func (c *certCheck) httpClient() (*http.Client, *http.Transport) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: redfishDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: redfishHandshakeTimeout,
		TLSClientConfig: &tls.Config{
			InsecureSkipVerify: true, // the pin replaces chain verification: see verify
			VerifyConnection:   c.verify,
		},
		MaxIdleConns:        redfishIdleConns,
		MaxIdleConnsPerHost: redfishIdleConns,
		IdleConnTimeout:     30 * time.Second,
	}
	// Some BMCs keep their session in a cookie; the jar lives as long as
	// the session.
	jar, _ := cookiejar.New(nil) // never fails without options
	return &http.Client{Transport: tr, Jar: jar}, tr
}
