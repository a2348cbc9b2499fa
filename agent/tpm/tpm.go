// Package tpm is the agent's side of a machine's TPM 2.0 identity: it
// opens the TPM (/dev/tpmrm0, else /dev/tpm0, as the kernel lists them in
// /sys/class/tpm), reads the endorsement key (EK) and its certificate from
// NV when the TPM holds one, makes an attestation key (AK) once per boot,
// and answers the appliance's credential-activation challenge
// (TPM2_ActivateCredential under the EK). A machine without a TPM gets
// ErrNoTPM from Open and registers as before.
//
// The TPM commands are go-attestation's (over go-tpm); this package
// encodes none by hand. Creating the AK stores the TCG's default storage
// root key at its persistent handle (0x81000001) and the activation keeps
// the EK at 0x81010001 when they are not there yet, as go-attestation
// does on every Linux machine it attests. It imports the generated API
// only.
package tpm

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/google/go-attestation/attest"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// ErrNoTPM means the machine has no TPM 2.0 the kernel made a device
// for (no TPM, a TPM 1.2, or no driver for it).
var ErrNoTPM = errors.New("no TPM 2.0 on this machine")

// Device is one open TPM. Its methods are safe for concurrent use; each
// blocks on the TPM (seconds on a slow TPM when a key is generated) and
// cannot be cancelled.
type Device struct {
	mu  sync.Mutex
	tpm *attest.TPM
	ek  *attest.EK
	ak  *attest.AK
	req *nodev1.AttestBeginRequest
}

// Open opens the machine's TPM, or returns ErrNoTPM.
func Open() (*Device, error) {
	t, err := attest.OpenTPM(nil)
	if errors.Is(err, attest.ErrTPMNotAvailable) {
		return nil, ErrNoTPM
	}
	if err != nil {
		return nil, fmt.Errorf("open TPM: %w", err)
	}
	return &Device{tpm: t}, nil
}

// OpenChannel opens a TPM 2.0 reached over rwc, a command channel that
// takes one whole command per Write and returns one whole response per
// Read (a TPM simulator's socket in tests, for instance). Close closes
// rwc.
func OpenChannel(rwc io.ReadWriteCloser) (*Device, error) {
	t, err := attest.OpenTPM(&attest.OpenConfig{CommandChannel: channel{rwc}})
	if err != nil {
		return nil, fmt.Errorf("open TPM: %w", err)
	}
	return &Device{tpm: t}, nil
}

// channel is a command channel without a measurement log.
type channel struct{ io.ReadWriteCloser }

func (channel) MeasurementLog() ([]byte, error) {
	return nil, errors.New("no measurement log over this channel")
}

// Begin returns what AttestBegin sends (without the boot MAC): the EK's
// public key, its certificate if the TPM holds one, and the AK's public
// part and creation attestation. The EK is read and the AK made on the
// first call; later calls return the same (the AK lives as long as the
// Device: a challenge is answered by the AK it was made for).
func (d *Device) Begin() (*nodev1.AttestBeginRequest, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.req != nil {
		return cloneReq(d.req), nil
	}
	eks, err := d.tpm.EKs()
	if err != nil {
		return nil, fmt.Errorf("read endorsement key: %w", err)
	}
	if len(eks) == 0 {
		return nil, errors.New("read endorsement key: the TPM offers none")
	}
	ek := eks[0]
	pub, err := x509.MarshalPKIXPublicKey(ek.Public)
	if err != nil {
		return nil, fmt.Errorf("endorsement key: %w", err)
	}
	var cert []byte
	if ek.Certificate != nil {
		cert = ek.Certificate.Raw
	}
	ak, err := d.tpm.NewAK(nil)
	if err != nil {
		return nil, fmt.Errorf("make attestation key: %w", err)
	}
	p := ak.AttestationParameters()
	d.ek, d.ak = &ek, ak
	d.req = &nodev1.AttestBeginRequest{
		EkPublic:      pub,
		EkCertificate: cert,
		Ak: &nodev1.AttestationKey{
			Public:            p.Public,
			CreateData:        p.CreateData,
			CreateAttestation: p.CreateAttestation,
			CreateSignature:   p.CreateSignature,
		},
	}
	return cloneReq(d.req), nil
}

func cloneReq(r *nodev1.AttestBeginRequest) *nodev1.AttestBeginRequest {
	return &nodev1.AttestBeginRequest{EkPublic: r.EkPublic, EkCertificate: r.EkCertificate, Ak: r.Ak}
}

// Activate recovers the challenge's secret with the TPM: it succeeds only
// on the TPM that holds the EK and the AK Begin returned.
func (d *Device) Activate(ch *nodev1.AttestBeginResponse) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ak == nil {
		return nil, errors.New("activate credential: no attestation key (call Begin first)")
	}
	secret, err := d.ak.ActivateCredentialWithEK(d.tpm, attest.EncryptedCredential{
		Credential: ch.GetCredential(),
		Secret:     ch.GetEncryptedSecret(),
	}, *d.ek)
	if err != nil {
		return nil, fmt.Errorf("activate credential: %w", err)
	}
	return secret, nil
}

// Close unloads the AK and closes the TPM.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ak != nil {
		d.ak.Close(d.tpm)
		d.ak = nil
	}
	return d.tpm.Close()
}
