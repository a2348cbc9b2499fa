package termsafe

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// Real attack sequences: each must come out of Escape (and Writer) with
// no byte a terminal acts on.
var attacks = map[string]struct {
	in, want string
}{
	"window title (OSC 0, BEL)":        {"\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
	"window title (OSC 0, ST)":         {"\x1b]0;pwned\x1b\\", `\x1b]0;pwned\x1b\`},
	"clear screen (CSI 2J)":            {"a\x1b[2Jb", `a\x1b[2Jb`},
	"clipboard write (OSC 52)":         {"\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07", `\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07`},
	"hyperlink (OSC 8)":                {"\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\", `\x1b]8;;http://evil/\x1b\click\x1b]8;;\x1b\`},
	"CSI in C1 form (U+009B)":          {"x\u009b2Jy", `x\u009b2Jy`},
	"OSC in C1 form (U+009D)":          {"\u009d0;t\u009c", `\u009d0;t\u009c`},
	"raw 0x9b byte (8-bit CSI)":        {"x\x9b2J", `x\x9b2J`},
	"right-to-left override":           {"evil\u202egnp.exe", `evil\u202egnp.exe`},
	"left-to-right embedding, pop":     {"\u202aa\u202c", `\u202aa\u202c`},
	"isolates":                         {"\u2066a\u2067b\u2068c\u2069", `\u2066a\u2067b\u2068c\u2069`},
	"DEL":                              {"a\x7fb", `a\u007fb`},
	"newline, tab, carriage return":    {"a\nb\tc\rd", `a\x0ab\x09c\x0dd`},
	"NUL":                              {"a\x00b", `a\x00b`},
	"printable Unicode kept":           {"Größe 日本 ✓ \\x1b", "Größe 日本 ✓ \\x1b"},
	"zero-width joiner is not control": {"a\u200db", "a\u200db"},
	"empty":                            {"", ""},
}

func TestEscape(t *testing.T) {
	for name, tc := range attacks {
		t.Run(name, func(t *testing.T) {
			got := Escape(tc.in)
			if got != tc.want {
				t.Errorf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if Has(got) {
				t.Errorf("Escape(%q) = %q still has control characters", tc.in, got)
			}
			if Escape(got) != got {
				t.Errorf("Escape is not idempotent on %q", got)
			}
			if Has(tc.in) != (tc.in != tc.want) {
				t.Errorf("Has(%q) = %v", tc.in, Has(tc.in))
			}
			assertInert(t, got)
		})
	}
}

// assertInert fails if s holds a byte or rune a terminal acts on.
func assertInert(t *testing.T, s string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\x07", "\x9b", "\x9d", "\u009b", "\u009d", "\u202e", "\u2066", "\x7f", "\x00"} {
		if strings.Contains(s, bad) {
			t.Errorf("%q still contains %q", s, bad)
		}
	}
}

func TestWriter(t *testing.T) {
	for name, tc := range attacks {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			line := "NAME   " + tc.in + "\n"
			n, err := Writer(&buf).Write([]byte(line))
			if err != nil || n != len(line) {
				t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(line))
			}
			assertInert(t, buf.String())
			if !strings.HasSuffix(buf.String(), "\n") {
				t.Errorf("the layout newline was escaped: %q", buf.String())
			}
		})
	}
	// Layout characters pass through.
	var buf bytes.Buffer
	Writer(&buf).Write([]byte("a\tb\r\nc\n"))
	if buf.String() != "a\tb\r\nc\n" {
		t.Errorf("layout changed: %q", buf.String())
	}
}

// JSON encoders leave DEL, C1 and bidi raw; Writer's escapes of them are
// JSON escapes with the same meaning.
func TestWriterKeepsJSON(t *testing.T) {
	v := map[string]string{"s": "a\x7fb\u009bc\u202ed\x1b"}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	Writer(&buf).Write(b)
	assertInert(t, buf.String())
	var back map[string]string
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("escaped JSON %s does not parse: %v", buf.String(), err)
	}
	if back["s"] != v["s"] {
		t.Errorf("escaped JSON reads %q, want %q", back["s"], v["s"])
	}
}

func FuzzEscape(f *testing.F) {
	for _, tc := range attacks {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := Escape(s)
		if Has(e) {
			t.Fatalf("Escape(%q) = %q has control characters", s, e)
		}
		if Escape(e) != e {
			t.Fatalf("Escape not idempotent on %q", s)
		}
		if !Has(s) && e != s {
			t.Fatalf("Escape changed clean %q to %q", s, e)
		}
	})
}

// TestBounded: invalid UTF-8 replaced, controls escaped, and the cut
// never splits a rune.
func TestBounded(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"switch-1", 255, "switch-1"},
		{"a\x1b]0;x\x07", 255, Escape("a\x1b]0;x\x07")},
		{"ab\xffc", 255, "ab\uFFFDc"},
		{"aé", 2, "a"},
		{"abcdef", 3, "abc"},
	} {
		got := Bounded(c.in, c.max)
		if got != c.want || len(got) > c.max || !utf8.ValidString(got) {
			t.Errorf("Bounded(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}
