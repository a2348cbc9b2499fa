// Package redfishtest is a small Redfish service for tests only: sessions
// (X-Auth-Token, and Basic auth), one ComputerSystem with PowerState, the
// Boot override PATCH, and the ComputerSystem.Reset action; an
// AccountService with a fixed set of account slots (accounts.go); one
// Chassis with Thermal and Power, and a Manager whose SEL log service
// has entries (health.go); the BIOS with its attribute registry and
// pending settings (bios.go), the UpdateService's firmware inventory,
// SimpleUpdate and its tasks (firmware.go), and the manager's virtual
// CD (media.go); the system's SerialConsole and a real SSH server
// bridging to a console emulator (console.go); backed by a
// Machine the test provides (for example an ipmi_sim chassis program that
// starts and stops a QEMU VM, or a MemMachine). It is enough for bmclib's
// gofish provider; it is not a conformance model of any vendor's BMC, and
// nothing in corrald imports it.
//
// Like a real BMC it serves HTTPS with a self-signed certificate of its
// own, generated at Start (Fingerprint is its pin); RotateCertificate
// replaces it, as a BMC reset to factory defaults or an impostor would.
package redfishtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Machine is what the service controls.
type Machine interface {
	// Power reports whether the machine is on.
	Power() (bool, error)
	// Reset performs a Redfish ResetType: On, ForceOff, GracefulShutdown,
	// ForceRestart, GracefulRestart, PowerCycle.
	Reset(resetType string) error
	// SetBoot applies a boot override: target Pxe, Hdd, BiosSetup or None;
	// enabled Once, Continuous or Disabled; mode UEFI or Legacy.
	SetBoot(target, enabled, mode string) error
}

// Server is a running test Redfish service over TLS on loopback.
type Server struct {
	Host string
	Port int
	User string
	Pass string

	m   Machine
	srv *http.Server

	mu         sync.Mutex
	cert       *tls.Certificate
	handshakes int
	sessions   map[string]string // token -> session id
	// sessionAccount is the account each session logged in as.
	sessionAccount map[string]*account
	nextID         int
	boot           map[string]string
	requests       []string
	// Garbage makes every authenticated answer unparseable.
	garbage bool
	// accounts are the BMC's fixed account slots (accounts.go); slot 1
	// is User/Pass.
	accounts []*account
	// health is what Chassis/1/Thermal, Chassis/1/Power and the SEL
	// answer (health.go).
	health Health
	// bios, firmware and media are the BIOS settings (bios.go), the
	// UpdateService and its tasks (firmware.go), and the virtual media
	// (media.go).
	bios     biosState
	firmware firmwareState
	media    mediaState
	// Console is the BMC's serial console over SSH (console.go).
	Console *Console
}

const (
	root     = "/redfish/v1/"
	systems  = "/redfish/v1/Systems"
	system   = "/redfish/v1/Systems/1"
	resetURI = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
	sessURI  = "/redfish/v1/SessionService/Sessions"
)

var resetTypes = []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle"}

// Start serves HTTPS on a loopback port until the test ends.
func Start(t testing.TB, user, pass string, m Machine) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return Serve(t, ln, user, pass, m)
}

// Serve serves HTTPS on ln (a listener the test chose, e.g. on the
// Redfish port 443) until the test ends.
func Serve(t testing.TB, ln net.Listener, user, pass string, m Machine) *Server {
	t.Helper()
	s := &Server{User: user, Pass: pass, m: m, sessions: map[string]string{}, sessionAccount: map[string]*account{}, accounts: newAccounts(user, pass), health: DefaultHealth(),
		bios: newBIOS(), firmware: newFirmware(), media: newMedia(),
		boot: map[string]string{"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None", "BootSourceOverrideMode": "Legacy"}}
	if err := s.RotateCertificate(); err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	s.Console = newConsole(t, s)
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serve),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{GetCertificate: s.certificate},
		// Clients that refuse the certificate end the handshake with an
		// alert; the server's complaint about it is expected noise.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("redfishtest: %v", err)
		}
	}()
	t.Cleanup(func() { _ = s.srv.Close(); <-done })
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	s.Host = host
	s.Port, _ = strconv.Atoi(port)
	return s
}

// certificate serves the current certificate (counted as a handshake).
func (s *Server) certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handshakes++
	return s.cert, nil
}

// RotateCertificate replaces the server's certificate with a new
// self-signed one (a new key too); the next handshake presents it.
func (s *Server) RotateCertificate() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "redfishtest BMC", Organization: []string{"Corral test BMC"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cert = &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	s.mu.Unlock()
	return nil
}

// Fingerprint is the pin of the current certificate: the lowercase hex
// SHA-256 of its DER.
func (s *Server) Fingerprint() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := sha256.Sum256(s.cert.Certificate[0])
	return hex.EncodeToString(sum[:])
}

// Handshakes counts the TLS handshakes the server has started.
func (s *Server) Handshakes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handshakes
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// Requested counts the requests so far whose "METHOD path" is req.
func (s *Server) Requested(req string) int {
	n := 0
	for _, r := range s.Requests() {
		if r == req {
			n++
		}
	}
	return n
}

// SetGarbage makes the service answer junk once a client is authenticated.
func (s *Server) SetGarbage(on bool) {
	s.mu.Lock()
	s.garbage = on
	s.mu.Unlock()
}

// Requests returns "METHOD path" of every request so far.
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

// Boot returns the current boot override.
func (s *Server) Boot() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.boot {
		out[k] = v
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func redfishError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{"code": "Base.1.0.GeneralError", "message": msg}})
}

func (s *Server) authorized(r *http.Request) bool {
	if u, p, ok := r.BasicAuth(); ok {
		return s.login(u, p) != nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A session lives as long as its account logs in: a disabled
	// account's sessions end with it.
	tok := r.Header.Get("X-Auth-Token")
	_, ok := s.sessions[tok]
	if a := s.sessionAccount[tok]; ok && a != nil && !a.Enabled {
		delete(s.sessions, tok)
		return false
	}
	return ok
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	s.mu.Lock()
	s.requests = append(s.requests, r.Method+" "+path)
	s.mu.Unlock()
	switch {
	case path == "/redfish":
		writeJSON(w, 200, map[string]string{"v1": root})
		return
	case path+"/" == root && r.Method == http.MethodGet:
		writeJSON(w, 200, map[string]any{
			"@odata.id": root, "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot", "Id": "RootService", "Name": "Corral test Redfish",
			"RedfishVersion": "1.6.0", "UUID": "92384634-2938-2342-8820-489239905423",
			"Systems":        map[string]string{"@odata.id": systems},
			"Chassis":        map[string]string{"@odata.id": chassisURI},
			"Managers":       map[string]string{"@odata.id": managersURI},
			"AccountService": map[string]string{"@odata.id": accountServiceURI},
			"SessionService": map[string]string{"@odata.id": "/redfish/v1/SessionService"},
			"Registries":     map[string]string{"@odata.id": registriesURI},
			"UpdateService":  map[string]string{"@odata.id": updateServiceURI},
			"TaskService":    map[string]string{"@odata.id": taskServiceURI},
			"Links":          map[string]any{"Sessions": map[string]string{"@odata.id": sessURI}},
		})
		return
	case path == sessURI && r.Method == http.MethodPost:
		var body struct{ UserName, Password string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			redfishError(w, 400, "malformed JSON")
			return
		}
		acct := s.login(body.UserName, body.Password)
		if acct == nil {
			redfishError(w, 401, "invalid credentials")
			return
		}
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		tok := hex.EncodeToString(b)
		s.mu.Lock()
		s.nextID++
		id := strconv.Itoa(s.nextID)
		s.sessions[tok] = id
		s.sessionAccount[tok] = acct
		s.mu.Unlock()
		w.Header().Set("X-Auth-Token", tok)
		w.Header().Set("Location", sessURI+"/"+id)
		writeJSON(w, 201, map[string]any{"@odata.id": sessURI + "/" + id, "Id": id, "UserName": body.UserName})
		return
	}
	if !s.authorized(r) {
		redfishError(w, 401, "authentication required")
		return
	}
	s.mu.Lock()
	garbage := s.garbage
	s.mu.Unlock()
	if garbage {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("\x00\x01<html>not redfish{{{"))
		return
	}
	if s.serveAccounts(w, r, path) || s.serveHealth(w, r, path) || s.serveBIOS(w, r, path) || s.serveFirmware(w, r, path) || s.serveMedia(w, r, path) {
		return
	}
	switch {
	case strings.HasPrefix(path, sessURI+"/") && r.Method == http.MethodDelete:
		id := strings.TrimPrefix(path, sessURI+"/")
		s.mu.Lock()
		for tok, sid := range s.sessions {
			if sid == id {
				delete(s.sessions, tok)
			}
		}
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case path == systems && r.Method == http.MethodGet:
		writeJSON(w, 200, map[string]any{
			"@odata.id": systems, "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection", "Name": "Systems",
			"Members": []map[string]string{{"@odata.id": system}}, "Members@odata.count": 1,
		})
	case path == system && r.Method == http.MethodGet:
		on, err := s.m.Power()
		if err != nil {
			redfishError(w, 500, err.Error())
			return
		}
		state := "Off"
		if on {
			state = "On"
		}
		boot := map[string]any{"BootSourceOverrideTarget@Redfish.AllowableValues": []string{"None", "Pxe", "Hdd", "Cd", "BiosSetup"}}
		for k, v := range s.Boot() {
			boot[k] = v
		}
		sys := map[string]any{
			"@odata.id": system, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem", "Id": "1", "Name": "System",
			"Manufacturer": "Corral", "Model": "Test Redfish", "SerialNumber": "RF-TEST-1", "PowerState": state,
			"Status": map[string]string{"State": "Enabled", "Health": "OK"},
			"Boot":   boot,
			"Bios":   map[string]string{"@odata.id": biosURI},
			"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
				"target": resetURI, "ResetType@Redfish.AllowableValues": resetTypes,
			}},
		}
		if sc, ok := s.Console.serialConsoleJSON(); ok {
			sys["SerialConsole"] = sc
		}
		writeJSON(w, 200, sys)
	case path == system && r.Method == http.MethodPatch:
		var body struct{ Boot map[string]string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Boot == nil {
			redfishError(w, 400, "PATCH wants a Boot object")
			return
		}
		s.mu.Lock()
		next := map[string]string{}
		for k, v := range s.boot {
			next[k] = v
		}
		s.mu.Unlock()
		for k, v := range body.Boot {
			next[k] = v
		}
		switch next["BootSourceOverrideTarget"] {
		case "None", "Pxe", "Hdd", "Cd", "BiosSetup":
		default:
			redfishError(w, 400, fmt.Sprintf("BootSourceOverrideTarget %q not allowed", next["BootSourceOverrideTarget"]))
			return
		}
		if err := s.m.SetBoot(next["BootSourceOverrideTarget"], next["BootSourceOverrideEnabled"], next["BootSourceOverrideMode"]); err != nil {
			redfishError(w, 500, err.Error())
			return
		}
		s.mu.Lock()
		s.boot = next
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case path == resetURI && r.Method == http.MethodPost:
		var body struct{ ResetType string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			redfishError(w, 400, "malformed JSON")
			return
		}
		valid := false
		for _, rt := range resetTypes {
			valid = valid || rt == body.ResetType
		}
		if !valid {
			redfishError(w, 400, fmt.Sprintf("ResetType %q not allowed", body.ResetType))
			return
		}
		if err := s.m.Reset(body.ResetType); err != nil {
			redfishError(w, 500, err.Error())
			return
		}
		// A one-shot override is consumed by the boot the reset causes,
		// and the BIOS takes its pending settings.
		if body.ResetType != "ForceOff" && body.ResetType != "GracefulShutdown" {
			s.mu.Lock()
			s.applyBIOS()
			if s.boot["BootSourceOverrideEnabled"] == "Once" {
				s.boot["BootSourceOverrideEnabled"] = "Disabled"
			}
			s.mu.Unlock()
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		redfishError(w, 404, "no such resource "+path)
	}
}

// MemMachine is a Machine in memory: power and the last boot override,
// nothing behind them. Safe for concurrent use.
type MemMachine struct {
	mu   sync.Mutex
	on   bool
	boot string
}

// Power reports whether the machine is on.
func (m *MemMachine) Power() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.on, nil
}

// Reset applies a ResetType.
func (m *MemMachine) Reset(resetType string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch resetType {
	case "On", "ForceRestart", "GracefulRestart", "PowerCycle":
		m.on = true
	case "ForceOff", "GracefulShutdown":
		m.on = false
	default:
		return fmt.Errorf("reset type %q", resetType)
	}
	return nil
}

// SetBoot records a boot override.
func (m *MemMachine) SetBoot(target, enabled, mode string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.boot = target + "/" + enabled + "/" + mode
	return nil
}
