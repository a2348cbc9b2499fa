// Package seal keeps BMC passwords sealed at rest: AES-256-GCM under a key
// file (0600) in corrald's data directory, created on first start. A
// sealed blob is bound to associated data (the machine name), so a blob
// copied onto another record does not open. It imports only the standard
// library.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// KeyFile is the key's file name inside the data directory.
const KeyFile = "bmc-seal.key"

const (
	keySize = 32
	version = 1
)

// ErrOpen means a blob could not be opened: wrong key, tampered blob or
// wrong associated data.
var ErrOpen = errors.New("sealed secret cannot be opened")

// Sealer seals and opens secrets. Safe for concurrent use.
type Sealer struct {
	aead cipher.AEAD
}

// New returns a Sealer for a 32-byte key.
func New(key []byte) (*Sealer, error) {
	if len(key) != keySize {
		return nil, fmt.Errorf("seal: key is %d bytes, want %d", len(key), keySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// Ensure loads the key at path, creating it (0600, random) if it does not
// exist. An existing key readable by group or others is refused, as is a
// key of the wrong size.
func Ensure(path string) (*Sealer, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, keySize)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			// Another process created it first: use theirs.
			return Ensure(path)
		}
		if err != nil {
			return nil, fmt.Errorf("seal: create key: %w", err)
		}
		if _, err := f.Write(key); err != nil {
			f.Close()
			os.Remove(path)
			return nil, fmt.Errorf("seal: write key: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
		return New(key)
	}
	if err != nil {
		return nil, fmt.Errorf("seal: read key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("seal: key file %s is mode %04o: it must be readable by its owner only (chmod 600)", path, fi.Mode().Perm())
	}
	if len(key) != keySize {
		return nil, fmt.Errorf("seal: key file %s holds %d bytes, want %d (corrupt?)", path, len(key), keySize)
	}
	return New(key)
}

// Seal encrypts plaintext bound to ad. The blob is version || nonce ||
// ciphertext.
func (s *Sealer) Seal(plaintext, ad []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out := append([]byte{version}, nonce...)
	return s.aead.Seal(out, nonce, plaintext, ad), nil
}

// Open decrypts a blob made by Seal with the same ad; it fails with
// ErrOpen otherwise.
func (s *Sealer) Open(blob, ad []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(blob) < 1+ns+s.aead.Overhead() || blob[0] != version {
		return nil, ErrOpen
	}
	pt, err := s.aead.Open(nil, blob[1:1+ns], blob[1+ns:], ad)
	if err != nil {
		return nil, ErrOpen
	}
	return pt, nil
}
