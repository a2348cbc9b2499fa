package lifecycle

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/keyrate"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The deployed OS's phone-home (docs/security.md, "Phone-home").
//
// cloud-init's phone_home module posts to
// /phone-home/<deployment_id>/<token> on the boot HTTP server once the OS
// has booted. The machine becomes DEPLOYED only when the token's SHA-256
// equals the one recorded for the machine's current deployment (compared
// in constant time), the machine is DEPLOYING that deployment, and the
// request comes from the deployment's pinned address. Requests are
// rate-limited per source address; a body over MaxPhoneHomeBody is
// refused. Every refusal is a bare 4xx status (nothing for a guesser to
// learn from), a rate-limited log line and, when the deployment names a
// machine, an entry on its timeline.

// Phone-home bounds.
const (
	// MaxPhoneHomeBody bounds a phone-home request's body (cloud-init
	// posts a few form fields: instance id, hostname, host keys).
	MaxPhoneHomeBody = 16 << 10
	// PhoneHomePath is the path prefix the handler serves.
	PhoneHomePath = "/phone-home/"
	// phoneHomeRate and phoneHomeBurst bound each source address.
	phoneHomeRate  = 1.0
	phoneHomeBurst = 5
	phoneHomeKeys  = 4096
)

// PhoneHome returns the handler of POST /phone-home/<deployment_id>/<token>,
// for the boot HTTP server. Safe for concurrent use.
func (l *Lifecycle) PhoneHome() http.Handler {
	return &phoneHome{l: l, rate: keyrate.New(phoneHomeRate, phoneHomeBurst, phoneHomeKeys)}
}

type phoneHome struct {
	l    *Lifecycle
	rate *keyrate.Table
}

func (h *phoneHome) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l := h.l
	src := sourceAddr(r.RemoteAddr)
	refuse := func(code int, m *inventoryv1.Machine, why string) {
		// The path holds the token: only its first segment is logged.
		l.warn("phone-home refused", "peer", src.String(), "deployment_id", clip(termsafe.Escape(firstSegment(r.URL.Path)), maxInstallID), "status", code, "reason", why)
		if m != nil {
			l.note(machineMAC(m), "phone-home-refused", why+" (from "+src.String()+")", map[string]string{"peer": src.String(), "install_id": m.GetDeployment().GetDeploymentId()})
		}
		http.Error(w, http.StatusText(code), code)
	}
	if !h.rate.Allow(src.String(), l.now()) {
		refuse(http.StatusTooManyRequests, nil, "rate limit of the source address")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		refuse(http.StatusMethodNotAllowed, nil, "not a POST")
		return
	}
	id, token, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, PhoneHomePath), "/")
	if !ok || !validID(id) || !validToken(token) {
		refuse(http.StatusNotFound, nil, "malformed path")
		return
	}
	body := http.MaxBytesReader(w, r.Body, MaxPhoneHomeBody)
	if _, err := io.Copy(io.Discard, body); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			refuse(http.StatusRequestEntityTooLarge, nil, "body over the limit")
			return
		}
		refuse(http.StatusBadRequest, nil, "body not read: "+err.Error())
		return
	}
	ctx := context.WithoutCancel(r.Context())
	m := l.deploymentMachine(ctx, id)
	if m == nil {
		refuse(http.StatusNotFound, nil, "no machine has deployment "+id)
		return
	}
	d := m.GetDeployment()
	if why, code := phoneHomeRefusal(m, id, token, src); why != "" {
		refuse(code, m, why)
		return
	}
	now := timestamppb.New(l.now())
	um, err := l.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		if why, _ := phoneHomeRefusal(m, id, token, src); why != "" {
			return errors.New(why)
		}
		if err := inventory.Transition(m, inventory.EventDeployBooted); err != nil {
			return err
		}
		m.Deployment.BootedAt = now
		m.Deployment.UpdatedAt = now
		m.Deployment.Step = "booted"
		m.Deployment.Detail = ""
		m.StateReason = ""
		m.Watchdog = nil
		return nil
	})
	if err != nil {
		refuse(http.StatusConflict, m, err.Error())
		return
	}
	l.deployOutcome(DeployDeployed)
	l.event(um, "lifecycle", "deployed", "deployed: the OS phoned home from "+src.String(), map[string]string{"install_id": id, "image": d.GetOsImage()})
	l.log.Info("machine deployed: the OS phoned home", "machine", um.GetName(), "deployment_id", id, "peer", src.String())
	w.WriteHeader(http.StatusOK)
}

// phoneHomeRefusal says why a phone-home of deployment id with token from
// src does not make m DEPLOYED ("" when it does), and the status.
func phoneHomeRefusal(m *inventoryv1.Machine, id, token string, src netip.Addr) (string, int) {
	d := m.GetDeployment()
	switch {
	case d.GetDeploymentId() != id:
		return "phone-home for deployment " + id + ", not the machine's current one", http.StatusNotFound
	case m.GetState() != inventoryv1.Machine_DEPLOYING:
		return "phone-home for a machine that is " + m.GetState().String() + ", not DEPLOYING", http.StatusConflict
	}
	want := d.GetPhoneHomeSha256()
	if want == "" || subtle.ConstantTimeCompare([]byte(tokenSum(token)), []byte(want)) != 1 {
		return "phone-home with a wrong token", http.StatusForbidden
	}
	if a := d.GetAddress(); a != "" {
		p, err := netip.ParsePrefix(a)
		if err != nil || p.Addr() != src {
			return "phone-home from " + src.String() + ", not the deployment's address " + a, http.StatusForbidden
		}
	}
	return "", 0
}

// deploymentMachine finds the machine whose current or past deployment is
// id: the index first, else a scan of the DEPLOYING machines.
func (l *Lifecycle) deploymentMachine(ctx context.Context, id string) *inventoryv1.Machine {
	if name, ok := l.deployIndex.get(id); ok {
		if m, err := l.inv.GetMachine(ctx, name); err == nil {
			return m
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ms, err := l.inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{State: inventoryv1.Machine_DEPLOYING, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY})
	if err != nil {
		l.log.Warn("phone-home: machines not listed", "err", err)
		return nil
	}
	for _, m := range ms {
		if m.GetDeployment().GetDeploymentId() == id {
			l.deployIndex.put(id, m.GetName())
			return m
		}
	}
	return nil
}

// sourceAddr is the request's source address (unmapped).
func sourceAddr(remote string) netip.Addr {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// validID accepts our deployment ids: hex, at most maxInstallID bytes.
func validID(s string) bool {
	if s == "" || len(s) > maxInstallID {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validToken accepts base64url text of a plausible length.
func validToken(s string) bool {
	if len(s) < 16 || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// firstSegment is the deployment id part of a phone-home path.
func firstSegment(path string) string {
	id, _, _ := strings.Cut(strings.TrimPrefix(path, PhoneHomePath), "/")
	return id
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
