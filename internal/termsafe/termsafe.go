// Package termsafe keeps control characters from the boot LAN away from an
// operator's terminal. Has says whether a string holds any; Escape rewrites
// them as printable escapes, for storage and for printing alike; Writer
// escapes everything written through it. It imports nothing of Corral's.
//
// A control character here is one a terminal or a text renderer acts on
// rather than shows: C0 (U+0000–U+001F, tab and newline included), DEL
// (U+007F), C1 (U+0080–U+009F, where U+009B is CSI and U+009D OSC), the
// bidirectional embeddings, overrides and isolates (U+202A–U+202E,
// U+2066–U+2069), which reorder what is shown around them, and any byte
// that is not part of valid UTF-8 (a lone 0x9b is CSI to a terminal in
// 8-bit mode).
//
// Escape writes a control rune below U+0020 as \xNN (as strconv.Quote
// does), any other control rune as \uNNNN, and a byte outside valid UTF-8
// as \xNN; printable Unicode, backslash included, is left as it is. The
// escaped form is printable ASCII, so a stored string shows what was sent
// (an operator reading a timeline sees the attempted ESC ] 52 instead of a
// replacement character that hides it), Escape of an escaped string
// changes nothing, and the \uNNNN form of what JSON encoders leave raw
// (DEL, C1, bidi) is still valid JSON with the same meaning.
package termsafe

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// IsControl reports whether r is a control rune in the package's sense.
func IsControl(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Has reports whether s holds a control character or a byte outside valid
// UTF-8.
func Has(s string) bool { return hasExcept(s, "") }

// hasExcept is Has ignoring the runes of keep (all below U+0080).
func hasExcept(s, keep string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 || c == 0x7f) && strings.IndexByte(keep, c) < 0 {
				return true
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || IsControl(r) {
			return true
		}
		i += n
	}
	return false
}

// Escape returns s with every control character and every byte outside
// valid UTF-8 written as an escape (see the package doc). It returns s
// itself when there is nothing to escape.
func Escape(s string) string {
	if !Has(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	appendEscaped(&b, s, "")
	return b.String()
}

// Bounded returns s as a printable string of at most limit bytes: invalid
// UTF-8 replaced by U+FFFD, control characters escaped (Escape), then cut
// on a rune boundary. For strings that arrive from the boot LAN (facts,
// LLDP) and are kept and printed.
func Bounded(s string, limit int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	s = Escape(s)
	if len(s) <= limit {
		return s
	}
	s = s[:limit]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// appendEscaped writes s escaped to b, leaving the runes of keep as they
// are.
func appendEscaped(b *strings.Builder, s, keep string) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(b, `\x%02x`, s[i])
		case IsControl(r) && !strings.ContainsRune(keep, r):
			if r < 0x20 {
				fmt.Fprintf(b, `\x%02x`, r)
			} else {
				fmt.Fprintf(b, `\u%04x`, r)
			}
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
}

// Writer returns a writer that escapes what is written through it to w,
// except newline, tab and carriage return, which lay out a command's own
// output (table cells escape those themselves). Each Write is escaped on
// its own: a rune split across two Writes is escaped as bytes. Write
// returns len(p) when w took the escaped bytes.
func Writer(w io.Writer) io.Writer { return &writer{w: w} }

type writer struct{ w io.Writer }

// layout is what Writer leaves raw.
const layout = "\n\t\r"

func (e *writer) Write(p []byte) (int, error) {
	s := string(p)
	if hasExcept(s, layout) {
		var b strings.Builder
		b.Grow(len(s) + 16)
		appendEscaped(&b, s, layout)
		s = b.String()
	}
	if _, err := io.WriteString(e.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}
