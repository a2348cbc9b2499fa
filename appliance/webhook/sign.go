package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// SecretPrefix starts a secret as shown to the operator (Standard
// Webhooks' form: the prefix, then the key in base64).
const SecretPrefix = "whsec_"

const secretBytes = 32

// NewSecret returns a random signing key and its printed form.
func NewSecret() (key []byte, printed string, err error) {
	key = make([]byte, secretBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, "", err
	}
	return key, SecretPrefix + base64.StdEncoding.EncodeToString(key), nil
}

// ParseSecret returns the key of a printed secret.
func ParseSecret(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, SecretPrefix))
	if err != nil || len(b) == 0 {
		return nil, fmt.Errorf("webhook: malformed secret")
	}
	return b, nil
}

// Header names a request carries.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	HeaderHub       = "X-Hub-Signature-256"
)

// Signatures returns the Standard Webhooks signature ("v1," and the base64
// HMAC-SHA256 of "id.timestamp.body") and GitHub's ("sha256=" and the hex
// HMAC-SHA256 of the body).
func Signatures(key []byte, id string, ts int64, body []byte) (standard, hub string) {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	standard = "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	g := hmac.New(sha256.New, key)
	g.Write(body)
	hub = "sha256=" + hex.EncodeToString(g.Sum(nil))
	return standard, hub
}

// SetHeaders sets the content type and the signature headers of a
// request carrying body.
func SetHeaders(h http.Header, key []byte, id string, ts int64, body []byte) {
	std, hub := Signatures(key, id, ts, body)
	h.Set("Content-Type", ContentType)
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderSignature, std)
	h.Set(HeaderHub, hub)
}
