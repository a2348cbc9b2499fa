package auth

import (
	"strings"
	"testing"
)

// FuzzParseToken: parseToken never panics, accepts only the exact shape
// crl_<16 lowercase hex>_<52 base32>, and returns the id it found there.
// Seeds live in testdata/fuzz/FuzzParseToken.
func FuzzParseToken(f *testing.F) {
	f.Fuzz(func(t *testing.T, token string) {
		id, ok := parseToken(token)
		if !ok {
			if id != "" {
				t.Fatalf("refused %q but returned id %q", token, id)
			}
			return
		}
		if len(token) != len(TokenPrefix)+idLen+1+secretLen || !validID(id) ||
			!strings.HasPrefix(token, TokenPrefix+id+"_") {
			t.Fatalf("accepted %q with id %q", token, id)
		}
		for _, c := range token[len(TokenPrefix)+idLen+1:] {
			if !('a' <= c && c <= 'z' || '2' <= c && c <= '7') {
				t.Fatalf("accepted %q: secret has %q", token, c)
			}
		}
	})
}
