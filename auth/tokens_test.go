package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestTokens(t *testing.T) (*Tokens, *mem.Store, *clock) {
	t.Helper()
	s := mem.New()
	t.Cleanup(func() { s.Close() })
	c := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	return &Tokens{Store: s, Now: c.now}, s, c
}

func mustCreate(t *testing.T, tk *Tokens, role authv1.Role, desc string, ttl time.Duration) string {
	t.Helper()
	tok, err := tk.Create(context.Background(), role, desc, ttl)
	if err != nil {
		t.Fatalf("Create(%v, %q, %v): %v", role, desc, ttl, err)
	}
	return tok
}

var tokenShape = regexp.MustCompile(`^crl_[0-9a-f]{16}_[a-z2-7]{52}$`)

func TestTokensRoundTrip(t *testing.T) {
	tests := map[string]struct {
		role authv1.Role
		desc string
		ttl  time.Duration
	}{
		"viewer":            {role: authv1.Role_ROLE_VIEWER, desc: "dashboards"},
		"operator with ttl": {role: authv1.Role_ROLE_OPERATOR, desc: "night shift", ttl: time.Hour},
		"admin":             {role: authv1.Role_ROLE_ADMIN, desc: "bootstrap"},
		"node":              {role: authv1.Role_ROLE_NODE, desc: "node-17"},
		"agent":             {role: authv1.Role_ROLE_AGENT, desc: "boot 52:54:00:12:34:56", ttl: 10 * time.Minute},
		"empty description": {role: authv1.Role_ROLE_VIEWER},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			tk, _, _ := newTestTokens(t)
			tok := mustCreate(t, tk, tc.role, tc.desc, tc.ttl)
			if !tokenShape.MatchString(tok) {
				t.Fatalf("token %q does not match %v", tok, tokenShape)
			}
			got, err := tk.Authenticate(ctx, tok)
			if err != nil {
				t.Fatalf("Authenticate: %v", err)
			}
			want := Principal{Role: tc.role, ID: tok[4:20], Subject: tc.desc}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("principal (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTokensAreDistinct(t *testing.T) {
	tk, _, _ := newTestTokens(t)
	seen := map[string]bool{}
	for range 50 {
		tok := mustCreate(t, tk, authv1.Role_ROLE_VIEWER, "", 0)
		if seen[tok] || seen[tok[4:20]] {
			t.Fatalf("token or id repeated: %s", tok)
		}
		seen[tok], seen[tok[4:20]] = true, true
	}
}

func TestAuthenticateRejects(t *testing.T) {
	ctx := context.Background()
	tk, _, clk := newTestTokens(t)
	good := mustCreate(t, tk, authv1.Role_ROLE_OPERATOR, "ops", time.Hour)
	revoked := mustCreate(t, tk, authv1.Role_ROLE_ADMIN, "old", 0)
	if err := tk.Revoke(ctx, revoked[4:20]); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	other := mustCreate(t, tk, authv1.Role_ROLE_OPERATOR, "other", 0)
	id, secret := good[4:20], good[21:]
	flipped := []byte(secret)
	flipped[0] = map[bool]byte{true: 'b', false: 'a'}[flipped[0] == 'a']

	tests := map[string]struct {
		token   string
		advance time.Duration
	}{
		"wrong secret":           {token: "crl_" + id + "_" + string(flipped)},
		"another token's secret": {token: "crl_" + id + "_" + other[21:]},
		"unknown id":             {token: "crl_0123456789abcdef_" + secret},
		"revoked":                {token: revoked},
		"expired":                {token: good, advance: time.Hour},
		"long expired":           {token: good, advance: 365 * 24 * time.Hour},
		"empty":                  {token: ""},
		"prefix only":            {token: "crl_"},
		"no prefix":              {token: good[4:]},
		"wrong prefix":           {token: "crx_" + good[4:]},
		"uppercase id":           {token: "crl_" + strings.ToUpper(id) + "_" + secret},
		"uppercase secret":       {token: "crl_" + id + "_" + strings.ToUpper(secret)},
		"short secret":           {token: good[:len(good)-1]},
		"long secret":            {token: good + "a"},
		"short id":               {token: "crl_" + id[1:] + "_" + secret},
		"extra field":            {token: good + "_x"},
		"padding":                {token: good[:len(good)-1] + "="},
		"trailing newline":       {token: good + "\n"},
		"bearer included":        {token: "Bearer " + good},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			clk.t = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Add(tc.advance)
			p, err := tk.Authenticate(ctx, tc.token)
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("Authenticate(%q) = %+v, %v; want ErrUnauthenticated", tc.token, p, err)
			}
			if diff := cmp.Diff(Principal{}, p); diff != "" {
				t.Errorf("principal on error (-want +got):\n%s", diff)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error %q contains the secret", err)
			}
		})
	}
	clk.t = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Add(59 * time.Minute)
	if _, err := tk.Authenticate(ctx, good); err != nil {
		t.Errorf("Authenticate a minute before expiry: %v", err)
	}
}

// An unknown id and a wrong secret must be indistinguishable to the caller.
func TestAuthenticateDoesNotRevealIDs(t *testing.T) {
	ctx := context.Background()
	tk, _, _ := newTestTokens(t)
	good := mustCreate(t, tk, authv1.Role_ROLE_VIEWER, "", 0)
	other := mustCreate(t, tk, authv1.Role_ROLE_VIEWER, "", 0)
	_, errWrongSecret := tk.Authenticate(ctx, good[:21]+other[21:])
	_, errUnknownID := tk.Authenticate(ctx, "crl_0000000000000000_"+good[21:])
	if errWrongSecret == nil || errUnknownID == nil {
		t.Fatalf("errors = %v, %v; want both non-nil", errWrongSecret, errUnknownID)
	}
	if diff := cmp.Diff(errUnknownID.Error(), errWrongSecret.Error()); diff != "" {
		t.Errorf("unknown id vs wrong secret error text (-unknown +wrong):\n%s", diff)
	}
}

func TestCreateRejects(t *testing.T) {
	tests := map[string]struct {
		role authv1.Role
		ttl  time.Duration
		want error
	}{
		"unspecified role": {role: authv1.Role_ROLE_UNSPECIFIED, want: ErrInvalidRole},
		"unknown role":     {role: authv1.Role(42), want: ErrInvalidRole},
		"negative role":    {role: authv1.Role(-1), want: ErrInvalidRole},
		"negative ttl":     {role: authv1.Role_ROLE_VIEWER, ttl: -time.Second, want: ErrInvalidTTL},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tk, s, _ := newTestTokens(t)
			tok, err := tk.Create(context.Background(), tc.role, "x", tc.ttl)
			if !errors.Is(err, tc.want) || tok != "" {
				t.Fatalf("Create = %q, %v; want \"\", %v", tok, err, tc.want)
			}
			kvs, err := s.List(context.Background(), "")
			if err != nil || len(kvs) != 0 {
				t.Errorf("store after refused Create: %d records, %v; want none", len(kvs), err)
			}
		})
	}
}

func TestStoredRecordHasNoPlaintext(t *testing.T) {
	ctx := context.Background()
	tk, s, clk := newTestTokens(t)
	tok := mustCreate(t, tk, authv1.Role_ROLE_ADMIN, "bootstrap", 24*time.Hour)
	id, secret := tok[4:20], tok[21:]

	kv, err := s.Get(ctx, TokenKeyPrefix+id)
	if err != nil {
		t.Fatalf("Get %s: %v", TokenKeyPrefix+id, err)
	}
	for _, leak := range []string{tok, secret, secret[:16], secret[len(secret)-16:]} {
		if bytes.Contains(kv.Value, []byte(leak)) {
			t.Errorf("stored bytes contain %q", leak)
		}
	}
	var got authv1.Token
	if err := record.Unmarshal(kv.Value, &got); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	want := &authv1.Token{
		Id:          id,
		Sha256:      sha256Of(tok),
		Role:        authv1.Role_ROLE_ADMIN,
		Description: "bootstrap",
		CreatedUnix: clk.t.Unix(),
		ExpiresUnix: clk.t.Add(24 * time.Hour).Unix(),
	}
	if diff := cmp.Diff(want, &got, protocmp.Transform()); diff != "" {
		t.Errorf("stored token (-want +got):\n%s", diff)
	}
}

func TestListAndRevoke(t *testing.T) {
	ctx := context.Background()
	tk, _, clk := newTestTokens(t)

	empty, err := tk.List(ctx)
	if err != nil || len(empty) != 0 {
		t.Fatalf("List on empty store = %v, %v; want empty", empty, err)
	}

	a := mustCreate(t, tk, authv1.Role_ROLE_VIEWER, "a", 0)
	b := mustCreate(t, tk, authv1.Role_ROLE_NODE, "b", time.Minute)
	want := []*authv1.Token{
		{Id: a[4:20], Role: authv1.Role_ROLE_VIEWER, Description: "a", CreatedUnix: clk.t.Unix()},
		{Id: b[4:20], Role: authv1.Role_ROLE_NODE, Description: "b", CreatedUnix: clk.t.Unix(), ExpiresUnix: clk.t.Add(time.Minute).Unix()},
	}
	if want[0].Id > want[1].Id {
		want[0], want[1] = want[1], want[0]
	}
	got, err := tk.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}

	if err := tk.Revoke(ctx, a[4:20]); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	got, err = tk.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(got) != 1 || got[0].GetId() != b[4:20] {
		t.Errorf("List after revoke = %v; want only %s", got, b[4:20])
	}
	if _, err := tk.Authenticate(ctx, a); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("Authenticate revoked token: %v; want ErrUnauthenticated", err)
	}
	if _, err := tk.Authenticate(ctx, b); err != nil {
		t.Errorf("Authenticate surviving token: %v", err)
	}

	for name, id := range map[string]string{
		"already revoked": a[4:20],
		"never existed":   "0123456789abcdef",
		"malformed":       "../../etc",
		"empty":           "",
	} {
		if err := tk.Revoke(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: Revoke(%q) = %v; want store.ErrNotFound", name, id, err)
		}
	}
}

func sha256Of(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

func TestPurgeExpired(t *testing.T) {
	tk, _, clock := newTestTokens(t)
	ctx := context.Background()
	keep, err := tk.Create(ctx, authv1.Role_ROLE_ADMIN, "forever", 0)
	if err != nil {
		t.Fatal(err)
	}
	long, _ := tk.Create(ctx, authv1.Role_ROLE_AGENT, "long", 10*time.Hour)
	for range 3 {
		if _, err := tk.Create(ctx, authv1.Role_ROLE_AGENT, "boot", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	clock.t = clock.t.Add(2 * time.Minute)
	n, err := tk.PurgeExpired(ctx)
	if err != nil || n != 3 {
		t.Fatalf("purged %d, %v; want 3", n, err)
	}
	for _, tok := range []string{keep, long} {
		if _, err := tk.Authenticate(ctx, tok); err != nil {
			t.Errorf("live token purged: %v", err)
		}
	}
	if all, _ := tk.List(ctx); len(all) != 2 {
		t.Fatalf("%d tokens left, want 2", len(all))
	}
}
