// Package paging is the one shape every List RPC pages in (AIP-158):
// page_size and page_token in the request, next_page_token in the answer.
// A token is opaque to callers: base64 of the position after which the
// next page starts (the last key served, and for orders other than key
// order the last sort value), the store revision the previous page was
// read at, and a fingerprint of the request's filter, so a token handed
// back with another filter is refused rather than silently misread.
//
// Servers use Size, Decode and Encode (or Slice for collections small
// enough to read whole); clients use All to read every page in turn.
//
// It imports nothing of Corral's but the error vocabulary.
package paging

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/corralhq/corral/internal/apierr"
)

// Page sizes shared by the List RPCs unless one says otherwise: a page of
// DefaultSize machine summaries with realistic facts is about 100 KB,
// and MaxSize summaries stay well under gRPC's 4 MiB default message
// limit (docs/architecture.md "Paged lists").
const (
	DefaultSize = 100
	MaxSize     = 1000
)

// Size returns the page size to serve for a request's page_size: def for
// 0 or less, most for more than most.
func Size(req int32, def, most int) int {
	switch {
	case req <= 0:
		return def
	case int(req) > most:
		return most
	}
	return int(req)
}

// Token is a decoded page token: where the next page starts.
type Token struct {
	// After is the key of the last item served; the next page starts
	// after it.
	After string `json:"a,omitempty"`
	// Sort is the sort value of the last item served, for orders other
	// than key order (empty in key order).
	Sort string `json:"s,omitempty"`
	// Rev is the store revision the previous page was read at (0 when the
	// server does not say).
	Rev int64 `json:"r,omitempty"`
	// Filter is the fingerprint of the request's filter (Fingerprint).
	Filter uint64 `json:"f"`
}

// tokenVersion prefixes every encoded token, so a later encoding can tell
// an old token from a garbled one.
const tokenVersion = "1."

// Encode returns t as an opaque page token.
func Encode(t Token) string {
	b, _ := json.Marshal(t) // a struct of strings and integers always marshals
	return tokenVersion + base64.RawURLEncoding.EncodeToString(b)
}

// Decode parses a page token for a request whose filter has the given
// fingerprint. The empty token is the first page (the zero Token, ok).
// A garbled token, or one made for another filter, is refused with an
// error of class apierr.ErrInvalid.
func Decode(s string, filter uint64) (Token, error) {
	if s == "" {
		return Token{Filter: filter}, nil
	}
	body, ok := strings.CutPrefix(s, tokenVersion)
	if !ok {
		return Token{}, apierr.Invalidf("page_token is malformed: pass the next_page_token of the previous answer")
	}
	b, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return Token{}, apierr.Invalidf("page_token is malformed: pass the next_page_token of the previous answer")
	}
	var t Token
	if err := json.Unmarshal(b, &t); err != nil || t.After == "" {
		return Token{}, apierr.Invalidf("page_token is malformed: pass the next_page_token of the previous answer")
	}
	if t.Filter != filter {
		return Token{}, apierr.Invalidf("page_token was made for a request with another filter, view or order: start again without a page_token")
	}
	return t, nil
}

// Fingerprint hashes the parts of a request that choose what a list
// holds and in which order (filters, view, order; never page_size or
// page_token), for Token.Filter. Parts are joined unambiguously.
func Fingerprint(parts ...string) uint64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// Slice pages a collection read whole and sorted by key (the small
// collections: networks, images, appliances, tokens): it returns the
// items after the token's key, at most size of them, and the token of the
// next page ("" on the last). Items must be sorted by key, keys unique.
// A garbled token or one of another filter is an apierr.ErrInvalid error.
func Slice[T any](items []T, key func(T) string, pageSize int32, pageToken string, filter uint64) ([]T, string, error) {
	tok, err := Decode(pageToken, filter)
	if err != nil {
		return nil, "", err
	}
	start := 0
	if tok.After != "" {
		start, _ = slices.BinarySearchFunc(items, tok.After, func(it T, k string) int { return strings.Compare(key(it), k) })
		if start < len(items) && key(items[start]) == tok.After {
			start++
		}
	}
	size := Size(pageSize, DefaultSize, MaxSize)
	end := min(start+size, len(items))
	page := items[start:end]
	next := ""
	if end < len(items) && len(page) > 0 {
		next = Encode(Token{After: key(page[len(page)-1]), Filter: filter})
	}
	return page, next, nil
}

// SortByKey sorts items by key, for Slice.
func SortByKey[T any](items []T, key func(T) string) {
	slices.SortFunc(items, func(a, b T) int { return strings.Compare(key(a), key(b)) })
}

// All reads every page: fetch is called with the page token ("" first)
// and returns a page and the next token; each item is handed to yield in
// order as its page arrives. It stops after limit items when limit > 0,
// at the last page, or at the first error from fetch or yield. A server
// that hands back the token it was given would loop forever; All stops
// with an error instead.
func All[T any](ctx context.Context, limit int, fetch func(ctx context.Context, token string) ([]T, string, error), yield func(T) error) error {
	token, n := "", 0
	for {
		items, next, err := fetch(ctx, token)
		if err != nil {
			return err
		}
		for _, it := range items {
			if limit > 0 && n >= limit {
				return nil
			}
			if err := yield(it); err != nil {
				return err
			}
			n++
		}
		if next == "" || (limit > 0 && n >= limit) {
			return nil
		}
		if next == token {
			return apierr.DataLossf("the server answered the page token it was given: paging would not end")
		}
		token = next
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
