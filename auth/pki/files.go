package pki

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

const (
	pemCertificate = "CERTIFICATE"
	pemPKCS8Key    = "PRIVATE KEY"
	pemECKey       = "EC PRIVATE KEY"
	pemPKCS1Key    = "RSA PRIVATE KEY"
)

// readOptional reads path. A missing file is reported as (nil, nil); any
// other failure is returned as an error naming the file.
func readOptional(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pki: read %s: %w", path, err)
	}
	return b, nil
}

// writeFileAtomic writes data to path with the given mode via a synced
// temporary file in the same directory followed by a rename (renameio), so
// readers see either the old content or the new, never a partial file.
func writeFileAtomic(path string, data []byte, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(perm))
	if err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	syncDir(dir)
	return nil
}

// syncDir makes a completed rename durable. Failure is ignored: some
// filesystems do not support fsync on directories and the data itself has
// already been synced.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	_ = d.Close()
}

// parseCertPEM decodes exactly one PEM CERTIFICATE block.
func parseCertPEM(data []byte) (*x509.Certificate, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM data found")
	}
	if block.Type != pemCertificate {
		return nil, fmt.Errorf("PEM block is %q, want %q", block.Type, pemCertificate)
	}
	if extra, _ := pem.Decode(rest); extra != nil {
		return nil, errors.New("more than one PEM block; want exactly one certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// parseKeyPEM decodes one PEM private key in PKCS#8, SEC 1 (EC) or PKCS#1
// (RSA) form and returns it as a signer.
func parseKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM data found")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case pemPKCS8Key:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case pemECKey:
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case pemPKCS1Key:
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("unsupported PEM block %q", block.Type)
	}
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key type %T cannot sign", key)
	}
	return signer, nil
}

// keyMatches reports whether signer's public key is pub.
func keyMatches(signer crypto.Signer, pub crypto.PublicKey) bool {
	k, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(pub)
}

func encodeCertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})
}

func encodeKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPKCS8Key, Bytes: der}), nil
}
