package pki

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"time"
)

// BootCACommonName is the subject common name of the boot CA.
const BootCACommonName = "Corral boot CA"

// bootRSABits is the size of the boot CA's and its server's RSA keys.
const bootRSABits = 2048

// The boot CA exists because firmware is not a TLS client like the
// others. UEFI HTTP boot verifies an HTTPS server with its own TLS stack,
// and EDK2's as Debian 12 builds it (OVMF 2022.11) has no elliptic
// curves: it cannot check the appliance CA's ECDSA signatures, and it
// offers only RSA key exchange. So HTTPS boot gets an RSA CA and server
// certificate of its own, kept beside the appliance CA and never used for
// anything else: what it protects is the integrity of the boot loader the
// firmware runs, and it proves nothing to any other client.

// EnsureBootCA returns the boot CA stored in dir (ca.crt, ca.key),
// creating a self-signed RSA-2048 CA "Corral boot CA" (ten years) the
// first time. Like EnsureCA it never replaces an existing pair; one that
// is not RSA is refused.
func EnsureBootCA(dir string) (*CA, error) {
	ca, err := ensureCA(dir, BootCACommonName, newRSAKey)
	if err != nil {
		return nil, err
	}
	if _, ok := ca.signer.Public().(*rsa.PublicKey); !ok {
		return nil, fmt.Errorf("pki: %s: the boot CA must be RSA (firmware TLS has no elliptic curves); remove ca.crt and ca.key there to make a new one", filepath.Join(dir, CACertFile))
	}
	return ca, nil
}

// EnsureBootServerCert returns the boot HTTPS server's certificate for
// hosts, stored in dir as server.crt and server.key and reissued as
// EnsureServerCert's is. It carries the server-auth usage and key
// encipherment (RSA key exchange), and no appliance identity: it is not
// valid for corrald's API.
func (ca *CA) EnsureBootServerCert(dir string, hosts []string) (tls.Certificate, error) {
	return ca.ensureServerCert(dir, hosts, false)
}

// BootTLSConfig is the TLS configuration of the HTTPS boot listener: TLS
// 1.2 and 1.3, with the RSA key exchange suites firmware needs listed
// explicitly (Go leaves them out of its defaults) after the ECDHE ones
// every other client picks.
func BootTLSConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		CipherSuites: []uint16{
			tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305,
			tls.TLS_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_RSA_WITH_AES_128_CBC_SHA256,
			tls.TLS_RSA_WITH_AES_128_CBC_SHA,
			tls.TLS_RSA_WITH_AES_256_CBC_SHA,
		},
	}
}

// efiCertX509 is EFI_CERT_X509_GUID (a1 59 c0 a5 e4 94 a7 4a 87 b5 ab
// 15 5c 2b f0 72), as the GUID is laid out in memory (the first three
// fields little-endian).
var efiCertX509 = [16]byte{0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72}

// bootCAOwner is the SignatureOwner GUID the list names (any GUID will
// do; this one is Corral's, fixed so the output is reproducible).
var bootCAOwner = [16]byte{0x63, 0x6f, 0x72, 0x72, 0x61, 0x6c, 0x2d, 0x62, 0x6f, 0x6f, 0x74, 0x2d, 0x63, 0x61, 0x00, 0x01}

// EFISignatureList wraps a DER certificate in an EFI_SIGNATURE_LIST of
// one EFI_CERT_X509 entry (UEFI 2.10 §32.4.1), the form firmware takes
// its HTTPS boot CA in: EDK2's TlsCaCertificate variable, or QEMU's
// fw_cfg file etc/edk2/https/cacerts for OVMF.
func EFISignatureList(der []byte) []byte {
	const header = 16 + 4 + 4 + 4 // SignatureType, ListSize, HeaderSize, SignatureSize
	sigSize := 16 + len(der)      // SignatureOwner + the certificate
	var b bytes.Buffer
	b.Write(efiCertX509[:])
	_ = binary.Write(&b, binary.LittleEndian, uint32(header+sigSize))
	_ = binary.Write(&b, binary.LittleEndian, uint32(0))
	_ = binary.Write(&b, binary.LittleEndian, uint32(sigSize))
	b.Write(bootCAOwner[:])
	b.Write(der)
	return b.Bytes()
}

// NotAfter is when the CA certificate expires.
func (ca *CA) NotAfter() time.Time { return ca.cert.NotAfter }

// CertDER returns the CA certificate in DER form.
func (ca *CA) CertDER() []byte { return bytes.Clone(ca.cert.Raw) }

func newRSAKey() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, bootRSABits) }
