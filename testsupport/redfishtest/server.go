// Package redfishtest is a small Redfish service for tests only: sessions
// (X-Auth-Token, and Basic auth), one ComputerSystem with PowerState, the
// Boot override PATCH, and the ComputerSystem.Reset action, backed by a
// Machine the test provides (for example an ipmi_sim chassis program that
// starts and stops a QEMU VM). It is enough for bmclib's gofish provider;
// it is not a conformance model of any vendor's BMC, and nothing in corrald
// imports it.
package redfishtest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
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
	srv *httptest.Server

	mu       sync.Mutex
	sessions map[string]string // token -> session id
	nextID   int
	boot     map[string]string
	requests []string
	// Garbage makes every authenticated answer unparseable.
	garbage bool
}

const (
	root     = "/redfish/v1/"
	systems  = "/redfish/v1/Systems"
	system   = "/redfish/v1/Systems/1"
	resetURI = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
	sessURI  = "/redfish/v1/SessionService/Sessions"
)

var resetTypes = []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle"}

// Start serves until the test ends.
func Start(t testing.TB, user, pass string, m Machine) *Server {
	t.Helper()
	s := &Server{User: user, Pass: pass, m: m, sessions: map[string]string{},
		boot: map[string]string{"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None", "BootSourceOverrideMode": "Legacy"}}
	s.srv = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	host, port, _ := net.SplitHostPort(s.srv.Listener.Addr().String())
	s.Host = host
	s.Port, _ = strconv.Atoi(port)
	return s
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

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
		return u == s.User && p == s.Pass
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[r.Header.Get("X-Auth-Token")]
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
			"SessionService": map[string]string{"@odata.id": "/redfish/v1/SessionService"},
			"Links":          map[string]any{"Sessions": map[string]string{"@odata.id": sessURI}},
		})
		return
	case path == sessURI && r.Method == http.MethodPost:
		var body struct{ UserName, Password string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			redfishError(w, 400, "malformed JSON")
			return
		}
		if body.UserName != s.User || body.Password != s.Pass {
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
		w.WriteHeader(200)
		_, _ = w.Write([]byte("\x00\x01<html>not redfish{{{"))
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
		w.WriteHeader(204)
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
		boot := map[string]any{"BootSourceOverrideTarget@Redfish.AllowableValues": []string{"None", "Pxe", "Hdd", "BiosSetup"}}
		for k, v := range s.Boot() {
			boot[k] = v
		}
		writeJSON(w, 200, map[string]any{
			"@odata.id": system, "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem", "Id": "1", "Name": "System",
			"Manufacturer": "Corral", "Model": "Test Redfish", "SerialNumber": "RF-TEST-1", "PowerState": state,
			"Status": map[string]string{"State": "Enabled", "Health": "OK"},
			"Boot":   boot,
			"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
				"target": resetURI, "ResetType@Redfish.AllowableValues": resetTypes,
			}},
		})
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
		case "None", "Pxe", "Hdd", "BiosSetup":
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
		w.WriteHeader(204)
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
		// A one-shot override is consumed by the boot the reset causes.
		if body.ResetType != "ForceOff" && body.ResetType != "GracefulShutdown" {
			s.mu.Lock()
			if s.boot["BootSourceOverrideEnabled"] == "Once" {
				s.boot["BootSourceOverrideEnabled"] = "Disabled"
			}
			s.mu.Unlock()
		}
		w.WriteHeader(204)
	default:
		redfishError(w, 404, "no such resource "+path)
	}
}
