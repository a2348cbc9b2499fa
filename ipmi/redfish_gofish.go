package ipmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"strconv"
	"time"

	"github.com/stmcginnis/gofish"
)

// redfishOpen reports whether the session's Redfish (gofish) provider
// opened.
func (s *session) redfishOpen() bool {
	if s.certs == nil || s.tr == nil || s.cl == nil {
		return false
	}
	for _, d := range s.cl.Registry.Drivers {
		if d.Name == RedfishProviderName {
			return true
		}
	}
	return false
}

// gofish opens a gofish client of its own on the session's BMC, for what
// bmclib's provider does not reach (AccountService slots by ID, Thermal,
// Power, log entries' severity): the same certificate check and HTTP
// settings as the provider (its transport), a session of its own, logged
// out by the function returned.
func (s *session) gofish(ctx context.Context) (*gofish.APIClient, func(), error) {
	if !s.redfishOpen() {
		return nil, nil, fmt.Errorf("%w: the %s provider did not open a session", ErrFailed, RedfishProviderName)
	}
	// The provider's transport: its connection (and TLS handshake, the
	// most of a poll's CPU) is reused; the session closes it.
	jar, _ := cookiejar.New(nil) // never fails without options
	hc := &http.Client{Transport: keepAlive{s.tr}, Jar: jar}
	port := s.t.PortFor(ProtocolRedfish)
	cl, err := gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint: "https://" + net.JoinHostPort(s.t.Host, strconv.Itoa(port)),
		Username: s.t.Username, Password: s.t.Password, HTTPClient: hc, ReuseConnections: true,
	})
	if err != nil {
		return nil, nil, redfishErr(ctx, err)
	}
	return cl, cl.Logout, nil
}

// redfishErr classifies a gofish error by what it says.
func redfishErr(ctx context.Context, err error) error {
	var ce *CertificateError
	switch {
	case errors.As(err, &ce):
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w: %w", ErrUnreachable, ctx.Err(), err)
	case isAuthText(err.Error()):
		return fmt.Errorf("%w: %w", ErrAuth, err)
	case isUnreachableText(err.Error()):
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return fmt.Errorf("%w: %w", ErrProtocol, err)
}

// redfishCall runs f as one attempt of the gofish provider in s,
// recorded in the answer.
func (s *session) redfishCall(ctx context.Context, f func(*gofish.APIClient) error) (err error) {
	start := time.Now()
	defer func() {
		at := Attempt{Provider: RedfishProviderName, Took: time.Since(start)}
		if err != nil {
			at.Err = err.Error()
		} else {
			s.answer.Provider = RedfishProviderName
		}
		s.answer.Attempts = append(s.answer.Attempts, at)
	}()
	cl, done, err := s.gofish(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := f(cl); err != nil {
		return redfishErr(ctx, err)
	}
	return nil
}

// keepAlive undoes gofish's Close on every request it sends through a
// client it was given (it keeps connections only on a client of its
// own): without it each request of a poll is a TCP connection and a TLS
// handshake (17 a health poll on the test server).
type keepAlive struct{ rt http.RoundTripper }

func (k keepAlive) RoundTrip(req *http.Request) (*http.Response, error) {
	if !req.Close {
		return k.rt.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	r.Close = false
	r.Header.Del("Connection")
	return k.rt.RoundTrip(r)
}
