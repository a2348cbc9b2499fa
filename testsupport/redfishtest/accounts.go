package redfishtest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

const (
	accountServiceURI = "/redfish/v1/AccountService"
	accountsURI       = "/redfish/v1/AccountService/Accounts"
)

// AccountSlots is how many account slots the service has, as many BMCs
// have a fixed number (slot 1 holds the account the server started with).
const AccountSlots = 8

// account is one slot of the AccountService, in its schema's names.
type account struct {
	ID       string
	UserName string
	Password string
	RoleID   string
	Enabled  bool
}

func newAccounts(user, pass string) []*account {
	out := make([]*account, AccountSlots)
	for i := range out {
		out[i] = &account{ID: strconv.Itoa(i + 1), RoleID: "ReadOnly"}
	}
	out[0].UserName, out[0].Password, out[0].RoleID, out[0].Enabled = user, pass, "Administrator", true
	return out
}

// login is the enabled account user and pass log in as, or nil.
func (s *Server) login(user, pass string) *account {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.accounts {
		if a.Enabled && user != "" && a.UserName == user && a.Password == pass {
			return a
		}
	}
	return nil
}

// Account is one account slot as the test sees it.
type Account struct {
	ID       string
	UserName string
	Password string
	RoleID   string
	Enabled  bool
}

// Accounts returns every account slot, passwords included.
func (s *Server) Accounts() []Account {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Account, 0, len(s.accounts))
	for _, a := range s.accounts {
		out = append(out, Account(*a))
	}
	return out
}

// LogsIn reports whether user and pass log in (an enabled account).
func (s *Server) LogsIn(user, pass string) bool { return s.login(user, pass) != nil }

func accountJSON(a *account) map[string]any {
	return map[string]any{
		"@odata.id": accountsURI + "/" + a.ID, "@odata.type": "#ManagerAccount.v1_4_0.ManagerAccount", "Id": a.ID,
		"Name": "User Account", "UserName": a.UserName, "Password": nil, "RoleId": a.RoleID, "Enabled": a.Enabled, "Locked": false,
		"AccountTypes": []string{"Redfish", "IPMI"},
	}
}

// accountPatch is what a PATCH or POST to an account may set.
type accountPatch struct {
	UserName *string
	Password *string
	RoleID   *string `json:"RoleId"`
	Enabled  *bool
}

// apply checks p and applies it to a; it says what was wrong.
func (s *Server) apply(a *account, p accountPatch) string {
	if p.UserName != nil {
		if *p.UserName != "" {
			for _, o := range s.accounts {
				if o != a && o.UserName == *p.UserName {
					return "UserName " + *p.UserName + " is in use"
				}
			}
		}
		a.UserName = *p.UserName
	}
	if p.Password != nil {
		if len(*p.Password) < 8 || len(*p.Password) > 20 {
			return "Password must have 8 to 20 characters"
		}
		a.Password = *p.Password
	}
	if p.RoleID != nil {
		switch *p.RoleID {
		case "Administrator", "Operator", "ReadOnly", "None":
		default:
			return "RoleId " + *p.RoleID + " is not allowed"
		}
		a.RoleID = *p.RoleID
	}
	if p.Enabled != nil {
		a.Enabled = *p.Enabled
	}
	if a.Enabled && (a.UserName == "" || a.Password == "") {
		return "an enabled account needs a UserName and a Password"
	}
	return ""
}

// serveAccounts answers AccountService requests; false for other paths.
func (s *Server) serveAccounts(w http.ResponseWriter, r *http.Request, path string) bool {
	switch {
	case path == accountServiceURI && r.Method == http.MethodGet:
		writeJSON(w, 200, map[string]any{
			"@odata.id": accountServiceURI, "@odata.type": "#AccountService.v1_5_0.AccountService", "Id": "AccountService",
			"Name": "Account Service", "ServiceEnabled": true, "MinPasswordLength": 8, "MaxPasswordLength": 20,
			"Accounts": map[string]string{"@odata.id": accountsURI},
		})
	case path == accountsURI && r.Method == http.MethodGet:
		s.mu.Lock()
		members := make([]map[string]string, 0, len(s.accounts))
		for _, a := range s.accounts {
			members = append(members, map[string]string{"@odata.id": accountsURI + "/" + a.ID})
		}
		s.mu.Unlock()
		writeJSON(w, 200, map[string]any{
			"@odata.id": accountsURI, "@odata.type": "#ManagerAccountCollection.ManagerAccountCollection", "Name": "Accounts",
			"Members": members, "Members@odata.count": len(members),
		})
	case path == accountsURI && r.Method == http.MethodPost:
		// Creating takes the first empty slot from 2 up, as BMCs with
		// fixed slots do.
		var p accountPatch
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.UserName == nil || p.Password == nil {
			redfishError(w, 400, "POST wants UserName and Password")
			return true
		}
		if p.Enabled == nil {
			on := true
			p.Enabled = &on
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, a := range s.accounts[1:] {
			if a.UserName != "" || a.Enabled {
				continue
			}
			next := *a
			if msg := s.apply(&next, p); msg != "" {
				redfishError(w, 400, msg)
				return true
			}
			*a = next
			w.Header().Set("Location", accountsURI+"/"+a.ID)
			writeJSON(w, 201, accountJSON(a))
			return true
		}
		redfishError(w, 400, "no free account slot")
	case strings.HasPrefix(path, accountsURI+"/"):
		s.mu.Lock()
		defer s.mu.Unlock()
		var a *account
		for _, o := range s.accounts {
			if accountsURI+"/"+o.ID == path {
				a = o
			}
		}
		if a == nil {
			redfishError(w, 404, "no such account "+path)
			return true
		}
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, 200, accountJSON(a))
		case http.MethodPatch:
			var p accountPatch
			if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
				redfishError(w, 400, "malformed JSON")
				return true
			}
			next := *a
			if msg := s.apply(&next, p); msg != "" {
				redfishError(w, 400, msg)
				return true
			}
			*a = next
			w.WriteHeader(http.StatusNoContent)
		default:
			redfishError(w, 405, r.Method+" "+path)
		}
	default:
		return false
	}
	return true
}
