package volume

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/apierr"
)

// Fetch errors, each a member of an apierr class (a bad request is
// ErrInvalid instead).
var (
	// ErrFetch: the source could not be downloaded (HTTP status, network,
	// timeout); class apierr.ErrPrecondition.
	ErrFetch = apierr.New(apierr.ErrPrecondition, "fetch failed")
	// ErrTooLarge: the source is larger than the allowed size; class
	// apierr.ErrExhausted.
	ErrTooLarge = apierr.New(apierr.ErrExhausted, "source too large")
	// ErrChecksum: the downloaded bytes do not have the expected SHA-256;
	// class apierr.ErrPrecondition.
	ErrChecksum = apierr.New(apierr.ErrPrecondition, "checksum mismatch")
)

// FetchRequest describes a download into a new volume.
type FetchRequest struct {
	Name string
	// URL is an http or https URL.
	URL string
	// SHA256 is the expected hex digest of the downloaded bytes; empty
	// skips the check (and is logged).
	SHA256 string
	// SizeBytes, when larger than the image's virtual size, grows the
	// volume after the download; smaller is ErrInvalid.
	SizeBytes uint64
	// MaxBytes caps the download (0 = the Store's MaxFetchBytes; a larger
	// value is lowered to it).
	MaxBytes uint64
	// Timeout bounds the download (0 = the Store's FetchTimeout).
	Timeout time.Duration
}

// Fetch downloads req.URL into a temporary file in the store directory,
// enforcing the size cap and the timeout while streaming, verifies the
// SHA-256, checks the format with qemu-img (an ISO9660 image stays raw,
// other raw images are converted to qcow2, a qcow2 with a backing file is
// refused), grows it to req.SizeBytes and
// links it into place. On any error no file is left behind. Errors:
// ErrInvalid (name, URL, digest syntax), ErrExists, ErrFetch (status,
// network, timeout), ErrTooLarge, ErrChecksum.
func (s *Store) Fetch(ctx context.Context, req FetchRequest) (Volume, error) {
	path, err := s.Path(req.Name)
	if err != nil {
		return Volume{}, err
	}
	u, err := url.Parse(req.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Volume{}, apierr.Invalidf("volume %q: source URL %q: want http(s)://host/...", req.Name, req.URL)
	}
	want := strings.ToLower(strings.TrimSpace(req.SHA256))
	if want != "" {
		if b, err := hex.DecodeString(want); err != nil || len(b) != sha256.Size {
			return Volume{}, apierr.Invalidf("volume %q: sha256 %q is not 64 hex digits", req.Name, req.SHA256)
		}
	}
	limit := s.cfg.MaxFetchBytes
	if req.MaxBytes != 0 && req.MaxBytes < limit {
		limit = req.MaxBytes
	}
	timeout := s.cfg.FetchTimeout
	if req.Timeout > 0 {
		timeout = req.Timeout
	}
	defer s.locks.Lock(req.Name)()
	if err := s.mustNotExist(req.Name, path); err != nil {
		return Volume{}, err
	}
	raw, err := s.tempPath(req.Name)
	if err != nil {
		return Volume{}, err
	}
	defer os.Remove(raw)
	start := time.Now()
	n, sum, err := s.download(ctx, u.String(), raw, limit, timeout)
	if err != nil {
		return Volume{}, fmt.Errorf("volume %q: %w", req.Name, err)
	}
	if want == "" {
		s.log.Warn("fetched volume without checksum", "volume", req.Name, "url", redact(u), "sha256", sum)
	} else if sum != want {
		return Volume{}, fmt.Errorf("volume %q: %w: %s has sha256 %s, want %s", req.Name, ErrChecksum, redact(u), sum, want)
	}
	s.log.Info("volume downloaded", "volume", req.Name, "url", redact(u), "bytes", n, "sha256", sum, "duration", time.Since(start).Round(time.Millisecond))

	return s.build(ctx, req.Name, path, func(tmp string) error {
		ii, err := s.info(ctx, raw)
		if err != nil {
			return err
		}
		switch ii.Format {
		case "qcow2":
			if ii.BackingFile != "" {
				return apierr.Invalidf("downloaded qcow2 has a backing file (%q): refused", ii.BackingFile)
			}
			if err := os.Rename(raw, tmp); err != nil {
				return err
			}
		case "raw":
			if isISO9660(raw) {
				// ISO images stay raw: they are attached as read-only
				// CD-ROMs, and "raw" is how a volume says it is one.
				if err := os.Rename(raw, tmp); err != nil {
					return err
				}
				ii.SizeBytes = uint64(n)
				if req.SizeBytes > ii.SizeBytes {
					s.log.Info("ISO image not resized", "volume", req.Name, "size_bytes", ii.SizeBytes, "requested_bytes", req.SizeBytes)
				}
				return nil
			}
			if err := s.qemuImg(ctx, "convert", "-q", "-f", "raw", "-O", "qcow2", raw, tmp); err != nil {
				return err
			}
			ii.SizeBytes = uint64(n)
		default:
			return apierr.Invalidf("downloaded image has format %q; want raw or qcow2", ii.Format)
		}
		if req.SizeBytes != 0 {
			if req.SizeBytes < ii.SizeBytes {
				return apierr.Invalidf("size %d is below the image's %d bytes", req.SizeBytes, ii.SizeBytes)
			}
			if req.SizeBytes > ii.SizeBytes {
				if err := s.qemuImg(ctx, "resize", "-q", "-f", "qcow2", tmp, strconv.FormatUint(req.SizeBytes, 10)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// isISO9660 reports whether the file carries an ISO9660 primary volume
// descriptor signature ("CD001" at byte 32769).
func isISO9660(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var sig [5]byte
	if _, err := f.ReadAt(sig[:], 32769); err != nil {
		return false
	}
	return string(sig[:]) == "CD001"
}

// download streams url into path and returns the byte count and hex
// SHA-256.
func (s *Store) download(ctx context.Context, rawURL, path string, limit uint64, timeout time.Duration) (int64, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, "", apierr.Invalidf("%v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", fetchErr(ctx, timeout, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, "", fmt.Errorf("%w: GET %s: HTTP %s", ErrFetch, redactString(rawURL), resp.Status)
	}
	if resp.ContentLength > 0 && uint64(resp.ContentLength) > limit {
		return 0, "", fmt.Errorf("%w: %s is %d bytes, limit %d", ErrTooLarge, redactString(rawURL), resp.ContentLength, limit)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return 0, "", fetchErr(ctx, timeout, err)
	}
	if uint64(n) > limit {
		return 0, "", fmt.Errorf("%w: %s exceeds the limit of %d bytes", ErrTooLarge, redactString(rawURL), limit)
	}
	if err := f.Sync(); err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

func fetchErr(ctx context.Context, timeout time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: timed out after %v: %v", ErrFetch, timeout, err)
	}
	return fmt.Errorf("%w: %v", ErrFetch, err)
}

// redact drops user info and the query (which may carry credentials).
func redact(u *url.URL) string {
	c := *u
	c.User = nil
	c.RawQuery = ""
	return c.String()
}

func redactString(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<invalid url>"
	}
	return redact(u)
}
