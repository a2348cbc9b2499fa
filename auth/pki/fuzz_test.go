package pki

import (
	"errors"
	"slices"
	"testing"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/internal/nodeid"
)

// FuzzSignNodeCSR feeds arbitrary bytes and names to the CSR parser and
// signer: it must never panic, every refusal wraps ErrBadCSR or
// ErrBadNodeName, and whatever it signs carries only the CA's choices.
// Seeds live in testdata/fuzz/FuzzSignNodeCSR.
func FuzzSignNodeCSR(f *testing.F) {
	ca, err := EnsureCA(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, csr []byte, name string) {
		_, cert, err := ca.SignNodeCSR(csr, name, nodeid.Organization, 0)
		if err != nil {
			if !errors.Is(err, ErrBadCSR) && !errors.Is(err, ErrBadNodeName) {
				t.Fatalf("SignNodeCSR: unclassified error %v", err)
			}
			return
		}
		if cert.Subject.CommonName != name || !slices.Equal(cert.DNSNames, []string{name}) ||
			len(cert.IPAddresses) != 0 || len(cert.URIs) != 0 || len(cert.EmailAddresses) != 0 {
			t.Fatalf("signed certificate carries more than the CA decided: CN %q DNS %v IP %v URI %v",
				cert.Subject.CommonName, cert.DNSNames, cert.IPAddresses, cert.URIs)
		}
		if clientconfig.VerifyAppliance(cert) == nil {
			t.Fatal("a node certificate passes as the appliance")
		}
	})
}
