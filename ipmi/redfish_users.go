package ipmi

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/redfish"
)

// A Redfish BMC's accounts are its AccountService's ManagerAccounts.
// Most BMCs have a fixed set of slots, each PATCHed to a user name,
// password and role (what bmclib's provider does, by name only); some
// create an account with a POST to the collection instead. Slots are
// addressed by their Id, which must be a number here, as IPMI's user IDs
// are (the machine record keeps a number).

// redfishAdministrator is the role Corral's account gets.
const redfishAdministrator = "Administrator"

func redfishAccounts(cl *gofish.APIClient) ([]*redfish.ManagerAccount, error) {
	as, err := cl.Service.AccountService()
	if err != nil {
		return nil, err
	}
	return as.Accounts()
}

func redfishAccountID(a *redfish.ManagerAccount) (int, error) {
	id, err := strconv.Atoi(a.ID)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("%w: Redfish account Id %q is not a number", ErrProtocol, a.ID)
	}
	return id, nil
}

// redfishSetAccount makes want's account with the client's credentials
// (self): the slot named want.Name, else want.ID if empty, else the first
// empty slot from 2 up (slot 1 is the vendor's on many BMCs), else a POST
// to the collection. The slot self logs in with is never touched.
func redfishSetAccount(cl *gofish.APIClient, self string, want Account) (int, error) {
	as, err := cl.Service.AccountService()
	if err != nil {
		return 0, err
	}
	accounts, err := as.Accounts()
	if err != nil {
		return 0, err
	}
	// gofish reads the members concurrently: in slot order, the lowest
	// free slot is taken, as over IPMI.
	slices.SortStableFunc(accounts, func(a, b *redfish.ManagerAccount) int {
		x, _ := strconv.Atoi(a.ID)
		y, _ := strconv.Atoi(b.ID)
		return cmp.Compare(x, y)
	})
	var named, empty []*redfish.ManagerAccount
	for _, a := range accounts {
		switch {
		case a.UserName == self:
		case a.UserName == want.Name:
			named = append(named, a)
		case a.UserName == "" && !a.Enabled && a.ID != "1":
			empty = append(empty, a)
		}
	}
	byID := func(a *redfish.ManagerAccount) bool { return want.ID > 0 && a.ID == strconv.Itoa(want.ID) }
	var slot *redfish.ManagerAccount
	switch {
	case slices.ContainsFunc(named, byID):
		slot = named[slices.IndexFunc(named, byID)]
	case len(named) > 0:
		slot = named[0]
	case slices.ContainsFunc(empty, byID):
		slot = empty[slices.IndexFunc(empty, byID)]
	case len(empty) > 0:
		slot = empty[0]
	}
	if slot == nil {
		a, err := as.CreateAccount(want.Name, want.Password, redfishAdministrator)
		if err != nil {
			return 0, fmt.Errorf("%w: no free account slot on the BMC (%d slots) and creating one failed: %w", ErrFailed, len(accounts), err)
		}
		return redfishAccountID(a)
	}
	id, err := redfishAccountID(slot)
	if err != nil {
		return 0, err
	}
	slot.UserName, slot.Password, slot.RoleID, slot.Enabled = want.Name, want.Password, redfishAdministrator, true
	if len(slot.AccountTypes) > 0 && !slices.Contains(slot.AccountTypes, redfish.RedfishAccountTypes) {
		slot.AccountTypes = append(slot.AccountTypes, redfish.RedfishAccountTypes)
	}
	if err := slot.Update(); err != nil {
		return 0, err
	}
	return id, nil
}

// redfishDisableAccount scrambles slot id's password and disables it; the
// name stays, so the slot is found again by it.
func redfishDisableAccount(cl *gofish.APIClient, self string, id int) error {
	accounts, err := redfishAccounts(cl)
	if err != nil {
		return err
	}
	for _, a := range accounts {
		if a.ID != strconv.Itoa(id) {
			continue
		}
		if a.UserName == self {
			return fmt.Errorf("%w: account %d is the account logged in with", ErrInvalid, id)
		}
		a.Password, a.Enabled = NewPassword(), false
		return a.Update()
	}
	return fmt.Errorf("%w: the BMC has no account %d", ErrFailed, id)
}
