package ipmi

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bougou/go-ipmi/pkg/command/app"
	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/stmcginnis/gofish"
)

// Account is a BMC user account: the one Corral keeps for itself on a
// machine's BMC (docs/architecture.md, "BMC credentials Corral owns").
// Password lives only in memory; String never prints it.
type Account struct {
	// ID is the BMC's user slot (IPMI user ID, 2 and up; a Redfish
	// ManagerAccount's numeric Id).
	ID       int
	Name     string
	Password string
}

func (a Account) String() string { return fmt.Sprintf("user %d %q", a.ID, a.Name) }

// PasswordLength is the length of the passwords NewPassword makes: 16
// bytes, which every IPMI BMC stores (the 20-byte form is optional, and
// OpenIPMI's ipmi_sim keeps 16 of 20 bytes given, so a 20-byte password
// would lock its account out).
const PasswordLength = 16

// NewPassword returns a random password of PasswordLength letters and
// digits (about 95 bits).
func NewPassword() string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, PasswordLength)
	// rand.Text is base32 only; a 62-letter alphabet by rejection
	// sampling gets more out of the BMC's 16 bytes.
	buf := make([]byte, 1)
	for i := 0; i < len(b); {
		if _, err := rand.Read(buf); err != nil {
			panic(err) // crypto/rand does not fail on Linux
		}
		if int(buf[0]) < 4*len(alphabet) { // 248: unbiased
			b[i] = alphabet[int(buf[0])%len(alphabet)]
			i++
		}
	}
	return string(b)
}

// native returns the session's native IPMI provider, or an error saying
// that managing BMC accounts needs it.
func (s *session) native() (*nativeProvider, error) {
	for _, d := range s.cl.Registry.Drivers {
		if np, ok := d.DriverInterface.(*nativeProvider); ok && np.c != nil {
			return np, nil
		}
	}
	return nil, fmt.Errorf("%w: BMC accounts are managed over IPMI by the %s provider, which did not open a session", ErrFailed, NativeProviderName)
}

// SetAccount makes want's account on the BMC with t's credentials: the
// slot named want.Name (other than t's own), or else the first empty
// slot from 3 up, gets the name, the password (16-byte form),
// administrator access with IPMI messaging on the LAN channel in use,
// and is enabled. The slot t logs in with is never touched. It returns
// the account's ID. The native IPMI provider manages accounts over IPMI;
// a BMC answered over Redfish alone has its AccountService used instead
// (redfish_users.go).
func (c *Controller) SetAccount(ctx context.Context, t Target, want Account) (int, Answer, error) {
	if want.Name == "" || len(want.Name) > 16 || want.Password == "" || len(want.Password) > 16 {
		return 0, Answer{}, fmt.Errorf("%w: an IPMI account needs a name of 1-16 bytes and a password of 1-16", ErrInvalid)
	}
	if want.Name == t.Username {
		return 0, Answer{}, fmt.Errorf("%w: the account to set is the one logged in with", ErrInvalid)
	}
	id := 0
	a, err := c.do(ctx, t, "account-set", func(ctx context.Context, s *session) error {
		np, err := s.native()
		if err != nil {
			if s.redfishOpen() {
				return s.redfishCall(ctx, func(cl *gofish.APIClient) error {
					id, err = redfishSetAccount(cl, t.Username, want)
					return err
				})
			}
			return err
		}
		start := time.Now()
		defer func() {
			at := Attempt{Provider: NativeProviderName, Took: time.Since(start)}
			if err != nil {
				at.Err = err.Error()
			} else {
				s.answer.Provider = NativeProviderName
			}
			s.answer.Attempts = append(s.answer.Attempts, at)
		}()
		id, err = np.setAccount(ctx, t.Username, want)
		return err
	})
	return id, a, err
}

// DisableAccount disables the account in slot id and scrambles its
// password, with t's credentials (which must not be that account's).
func (c *Controller) DisableAccount(ctx context.Context, t Target, id int) (Answer, error) {
	if id < 1 {
		return Answer{}, fmt.Errorf("%w: account ID %d", ErrInvalid, id)
	}
	return c.do(ctx, t, "account-disable", func(ctx context.Context, s *session) error {
		np, err := s.native()
		if err != nil {
			if s.redfishOpen() {
				return s.redfishCall(ctx, func(cl *gofish.APIClient) error { return redfishDisableAccount(cl, t.Username, id) })
			}
			return err
		}
		if id < 2 || id > 63 {
			return fmt.Errorf("%w: IPMI user ID %d", ErrInvalid, id)
		}
		ch, err := np.channel(ctx)
		if err != nil {
			return err
		}
		name, err := np.userName(ctx, uint8(id))
		if err != nil {
			return err
		}
		if name == t.Username {
			return fmt.Errorf("%w: user %d is the account logged in with", ErrInvalid, id)
		}
		if _, err := np.c.SetUserPassword(ctx, uint8(id), NewPassword(), false); err != nil {
			return classifyNative(ctx, err)
		}
		if err := np.c.DisableUser(ctx, uint8(id)); err != nil {
			return classifyNative(ctx, err)
		}
		// No access on the channel either: a BMC that ignores the
		// disable still refuses the slot.
		if _, err := np.c.SetUserAccess(ctx, &app.SetUserAccessRequest{EnableChanging: true, ChannelNumber: ch, UserID: uint8(id),
			MaxPrivLevel: 0x0f}); err != nil {
			return classifyNative(ctx, err)
		}
		s.answer.Provider = NativeProviderName
		return nil
	})
}

// channel is the number of the LAN channel the session runs on.
func (p *nativeProvider) channel(ctx context.Context) (uint8, error) {
	ci, err := p.c.GetChannelInfo(ctx, 0x0e) // 0Eh: this channel
	if err != nil {
		return 0, classifyNative(ctx, err)
	}
	return ci.ActualChannelNumber & 0x0f, nil
}

// userName reads slot id's name ("" for an empty slot).
func (p *nativeProvider) userName(ctx context.Context, id uint8) (string, error) {
	r, err := p.c.GetUsername(ctx, id)
	if err != nil {
		if _, ok := types.IsResponseError(err); ok {
			return "", nil // an unset slot
		}
		return "", classifyNative(ctx, err)
	}
	return strings.TrimRight(r.Username, "\x00 "), nil
}

func (p *nativeProvider) setAccount(ctx context.Context, self string, want Account) (int, error) {
	ch, err := p.channel(ctx)
	if err != nil {
		return 0, err
	}
	acc, err := p.c.GetUserAccess(ctx, ch, 1)
	if err != nil {
		return 0, classifyNative(ctx, err)
	}
	maxID := int(acc.MaxUsersIDCount)
	// Slot 1 is the anonymous user and slot 2 usually the vendor's
	// administrator: an empty slot is looked for from 3 up.
	var named, empty []int
	for id := 2; id <= maxID; id++ {
		name, err := p.userName(ctx, uint8(id))
		if err != nil {
			return 0, err
		}
		switch {
		case name == self:
		case name == want.Name:
			named = append(named, id)
		case name == "" && id >= 3:
			empty = append(empty, id)
		}
	}
	var id int
	switch {
	case want.ID >= 3 && (slices.Contains(named, want.ID) || slices.Contains(empty, want.ID)):
		id = want.ID
	case len(named) > 0:
		id = named[0]
	case len(empty) > 0:
		id = empty[0]
	default:
		return 0, fmt.Errorf("%w: no free user slot on the BMC (%d slots)", ErrFailed, maxID)
	}
	u := uint8(id)
	if _, err := p.c.SetUsername(ctx, u, want.Name); err != nil {
		return 0, classifyNative(ctx, err)
	}
	if _, err := p.c.SetUserPassword(ctx, u, want.Password, false); err != nil {
		return 0, classifyNative(ctx, err)
	}
	if _, err := p.c.SetUserAccess(ctx, &app.SetUserAccessRequest{EnableChanging: true, EnableIPMIMessaging: true, EnableLinkAuth: true,
		ChannelNumber: ch, UserID: u, MaxPrivLevel: uint8(types.PrivilegeLevelAdministrator)}); err != nil {
		return 0, classifyNative(ctx, err)
	}
	if err := p.c.EnableUser(ctx, u); err != nil {
		return 0, classifyNative(ctx, err)
	}
	return id, nil
}
