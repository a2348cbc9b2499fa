package cli

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
)

// sizeUnits maps a lower-cased unit suffix to its multiplier. Decimal
// prefixes are powers of 1000 (10G = 10*10^9), binary ones powers of 1024
// (1GiB = 2^30).
var sizeUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "ki": 1 << 10, "kib": 1 << 10,
	"m": 1e6, "mb": 1e6, "mi": 1 << 20, "mib": 1 << 20,
	"g": 1e9, "gb": 1e9, "gi": 1 << 30, "gib": 1 << 30,
	"t": 1e12, "tb": 1e12, "ti": 1 << 40, "tib": 1 << 40,
	"p": 1e15, "pb": 1e15, "pi": 1 << 50, "pib": 1 << 50,
	"e": 1e18, "eb": 1e18, "ei": 1 << 60, "eib": 1 << 60,
}

// parseSize parses a byte count: plain digits ("1073741824") or a number
// with a unit ("512MiB", "1GiB", "10G", "1.5GiB"). The number is decimal
// digits with at most one fractional part; the result must be a whole
// number of bytes that fits in uint64. Signs, exponents, hex, inner spaces
// and unknown units are rejected.
func parseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intPart := s[:i]
	fracPart := ""
	if i < len(s) && s[i] == '.' {
		j := i + 1
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		fracPart = s[i+1 : j]
		if fracPart == "" {
			return 0, fmt.Errorf("size %q: malformed number", s)
		}
		i = j
	}
	if intPart == "" {
		return 0, fmt.Errorf("size %q: want a number of bytes, optionally with a unit such as MiB, GiB or G", s)
	}
	unit := s[i:]
	mult, ok := sizeUnits[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, K, M, G, T, P, E or KiB, MiB, GiB, TiB, PiB, EiB)", s, unit)
	}

	// value = intPart.fracPart * mult, computed exactly.
	num, _ := new(big.Int).SetString(intPart+fracPart, 10)
	num.Mul(num, new(big.Int).SetUint64(mult))
	den := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(fracPart))), nil)
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if r.Sign() != 0 {
		return 0, fmt.Errorf("size %q: not a whole number of bytes", s)
	}
	if !q.IsUint64() {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return q.Uint64(), nil
}

// humanBytes renders n with binary units in the CLI's compact form:
// 512B, 1KiB, 1.5GiB, 64GiB. The figure is humanize.IBytes's (one decimal
// below 10 units, whole units from 10 on) without its space or a ".0";
// with at most one decimal, ".0" can only be that trailing zero.
func humanBytes(n uint64) string {
	return strings.NewReplacer(" ", "", ".0", "").Replace(humanize.IBytes(n))
}

// sizeValue is a pflag.Value for byte sizes parsed by parseSize.
type sizeValue struct{ p *uint64 }

func (v sizeValue) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatUint(*v.p, 10)
}

func (v sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

func (sizeValue) Type() string { return "SIZE" }
