package netup

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestOrder(t *testing.T) {
	a := NIC{Name: "eno1", MAC: "aa:bb:cc:00:00:01", Carrier: true}
	b := NIC{Name: "eno2", MAC: "aa:bb:cc:00:00:02", Carrier: false}
	c := NIC{Name: "ens1", MAC: "aa:bb:cc:00:00:03", Carrier: true}
	for name, tc := range map[string]struct {
		nics []NIC
		boot string
		want []NIC
	}{
		"boot NIC first":                    {[]NIC{a, b, c}, "AA:BB:CC:00:00:03", []NIC{c, a}},
		"boot NIC without link still tried": {[]NIC{a, b, c}, "aa:bb:cc:00:00:02", []NIC{b, a, c}},
		"unknown boot MAC: NICs with link":  {[]NIC{a, b, c}, "de:ad:be:ef:00:00", []NIC{a, c}},
		"nothing has link, boot NIC absent": {[]NIC{b}, "de:ad:be:ef:00:00", nil},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Order(tc.nics, tc.boot)); diff != "" {
				t.Errorf("Order (-want +got):\n%s", diff)
			}
		})
	}
}
