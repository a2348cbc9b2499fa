package volume

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/apierr"
)

// Fetch errors, each a member of an apierr class (a bad request is
// apierr.ErrInvalid instead).
var (
	// ErrFetch: the source could not be downloaded (HTTP status, network,
	// timeout, a body shorter than announced); class
	// apierr.ErrPrecondition.
	ErrFetch = apierr.New(apierr.ErrPrecondition, "fetch failed")
	// ErrTooLarge: the source is larger than the allowed size; class
	// apierr.ErrExhausted.
	ErrTooLarge = apierr.New(apierr.ErrExhausted, "source too large")
	// ErrChecksum: the downloaded bytes do not have the expected SHA-256;
	// class apierr.ErrPrecondition.
	ErrChecksum = apierr.New(apierr.ErrPrecondition, "checksum mismatch")
	// ErrRedirect: the source redirected to a scheme other than http(s),
	// from https to http, or more often than Config.MaxRedirects; class
	// apierr.ErrInvalid.
	ErrRedirect = apierr.New(apierr.ErrInvalid, "redirect refused")
	// ErrImageRefused: the downloaded file is not an image the node
	// accepts (a qcow2 with a backing file or an external data file, an
	// encrypted or malformed qcow2, a format other than the declared one,
	// an empty file); class apierr.ErrInvalid.
	ErrImageRefused = apierr.New(apierr.ErrInvalid, "image refused")
)

// FetchRequest describes a download into a new volume.
type FetchRequest struct {
	Name string
	// URL is an http or https URL.
	URL string
	// SHA256 is the expected hex digest of the downloaded bytes; empty
	// skips the check (and is logged).
	SHA256 string
	// Format is the format the caller declares: FormatQcow2, FormatRaw,
	// or "" for none (see the package comment for what each accepts).
	Format string
	// SizeBytes, when larger than the image's virtual size, grows the
	// volume after the download; smaller is apierr.ErrInvalid.
	SizeBytes uint64
	// MaxBytes caps the download (0 = the Store's MaxFetchBytes; a larger
	// value is lowered to it).
	MaxBytes uint64
	// Timeout bounds the download (0 = the Store's FetchTimeout).
	Timeout time.Duration
}

// Fetch downloads req.URL into a temporary file in the store directory,
// enforcing the size cap, the timeout and the redirect rules while
// streaming, verifies the SHA-256, decides the format (checkImage: the
// declared one, or Corral's own sniff between qcow2 and raw, never
// qemu-img's probe), refuses what is not self-contained, then keeps a
// qcow2 as is, keeps an ISO9660 image raw, converts other raw images to
// qcow2, grows the result to req.SizeBytes and links it into place. On
// any error no file is left behind and the directory is as before.
// Errors: apierr.ErrInvalid (name, URL, digest, format syntax), apierr.ErrAlreadyExists,
// ErrFetch (status, network, timeout, truncated body), ErrRedirect,
// ErrTooLarge, ErrChecksum, ErrImageRefused.
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
	switch req.Format {
	case "", FormatQcow2, FormatRaw:
	default:
		return Volume{}, apierr.Invalidf("volume %q: format %q: want %s, %s or none", req.Name, req.Format, FormatQcow2, FormatRaw)
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
		s.log.Warn("volume download failed", "volume", req.Name, "url", redact(u), "err", err)
		return Volume{}, fmt.Errorf("volume %q: %w", req.Name, err)
	}
	if want == "" {
		s.log.Warn("fetched volume without checksum", "volume", req.Name, "url", redact(u), "sha256", sum)
	} else if sum != want {
		return Volume{}, fmt.Errorf("volume %q: %w: %s has sha256 %s, want %s", req.Name, ErrChecksum, redact(u), sum, want)
	}
	s.log.Info("volume downloaded", "volume", req.Name, "url", redact(u), "bytes", n, "sha256", sum, "duration", time.Since(start).Round(time.Millisecond))

	ii, err := s.checkImage(ctx, raw, req.Format)
	if err != nil {
		s.log.Warn("downloaded image refused", "volume", req.Name, "url", redact(u), "declared_format", req.Format, "err", err)
		return Volume{}, fmt.Errorf("volume %q: %s: %w", req.Name, redact(u), err)
	}
	return s.build(ctx, req.Name, path, func(tmp string) error {
		switch ii.Format {
		case FormatQcow2:
			if err := os.Rename(raw, tmp); err != nil {
				return err
			}
		case FormatRaw:
			if isISO9660(raw) {
				// ISO images stay raw: they are attached as read-only
				// CD-ROMs, and "raw" is how a volume says it is one.
				if err := os.Rename(raw, tmp); err != nil {
					return err
				}
				if req.SizeBytes > ii.SizeBytes {
					s.log.Info("ISO image not resized", "volume", req.Name, "size_bytes", ii.SizeBytes, "requested_bytes", req.SizeBytes)
				}
				return nil
			}
			if err := s.qemuImg(ctx, "convert", "-q", "-f", FormatRaw, "-O", FormatQcow2, raw, tmp); err != nil {
				return err
			}
		}
		if req.SizeBytes != 0 {
			if req.SizeBytes < ii.SizeBytes {
				return apierr.Invalidf("size %d is below the image's %d bytes", req.SizeBytes, ii.SizeBytes)
			}
			if req.SizeBytes > ii.SizeBytes {
				if err := s.qemuImg(ctx, "resize", "-q", "-f", FormatQcow2, tmp, strconv.FormatUint(req.SizeBytes, 10)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// checkImage decides the format of a downloaded file and refuses what may
// not become a volume. The format is the declared one when given, and the
// file must match it; otherwise Corral's own sniff (qcow2 magic, or raw).
// A qcow2 header is parsed in Go before qemu-img sees the file, so an
// image naming a backing file, an external data file (including json:
// pseudo-protocol names) or a secret is refused without any tool opening
// what it names; qemu-img info then runs with that format given (-f),
// and its answer is checked again. Errors wrap ErrImageRefused, except a
// failing qemu-img, which is reported as is.
func (s *Store) checkImage(ctx context.Context, path, declared string) (Volume, error) {
	probed, err := sniffFormat(path)
	if err != nil {
		return Volume{}, err
	}
	if st, err := os.Stat(path); err != nil {
		return Volume{}, err
	} else if st.Size() == 0 {
		return Volume{}, fmt.Errorf("%w: the downloaded file is empty", ErrImageRefused)
	}
	switch {
	case declared == FormatQcow2 && probed != FormatQcow2:
		return Volume{}, fmt.Errorf("%w: declared qcow2, but the file has no qcow2 header (a raw image? declare raw)", ErrImageRefused)
	case declared == FormatRaw && probed != FormatRaw:
		return Volume{}, fmt.Errorf("%w: declared raw, but the file starts with a qcow2 header (declare qcow2)", ErrImageRefused)
	}
	if probed == FormatQcow2 {
		f, err := os.Open(path)
		if err != nil {
			return Volume{}, err
		}
		h, err := parseQcow2Header(f)
		f.Close()
		if err != nil {
			return Volume{}, fmt.Errorf("%w: malformed qcow2 header: %v", ErrImageRefused, err)
		}
		if why := refuseQcow2(h); why != "" {
			return Volume{}, fmt.Errorf("%w: qcow2 refused: %s", ErrImageRefused, why)
		}
	}
	ii, err := s.infoAs(ctx, path, probed)
	if err != nil {
		return Volume{}, err
	}
	switch {
	case ii.format != probed:
		return Volume{}, fmt.Errorf("%w: qemu-img reads it as %q, not %q", ErrImageRefused, ii.format, probed)
	case ii.backing != "":
		return Volume{}, fmt.Errorf("%w: qcow2 refused: it has a backing file %s: a fetched image must be self-contained", ErrImageRefused, quoteName(ii.backing))
	case ii.dataFile != "":
		return Volume{}, fmt.Errorf("%w: qcow2 refused: it has an external data file %s: a fetched image must be self-contained", ErrImageRefused, quoteName(ii.dataFile))
	case ii.encrypted:
		return Volume{}, fmt.Errorf("%w: qcow2 refused: it is encrypted: the node holds no image secrets", ErrImageRefused)
	case ii.v.SizeBytes == 0:
		return Volume{}, fmt.Errorf("%w: its virtual size is 0", ErrImageRefused)
	}
	return ii.v, nil
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
// SHA-256. The file is synced before it returns.
func (s *Store) download(ctx context.Context, rawURL, path string, limit uint64, timeout time.Duration) (int64, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, "", apierr.Invalidf("%v", err)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		if errors.Is(err, ErrRedirect) {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // it names the URLs, redacted; ue's may carry credentials
			}
			return 0, "", err
		}
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
		if errors.Is(err, io.ErrUnexpectedEOF) {
			if resp.ContentLength < 0 {
				return 0, "", fmt.Errorf("%w: %s: the chunked body ended without its last chunk after %d bytes (truncated)", ErrFetch, redactString(rawURL), n)
			}
			return 0, "", fmt.Errorf("%w: %s: the body ended after %d of %d announced bytes (truncated)", ErrFetch, redactString(rawURL), n, resp.ContentLength)
		}
		return 0, "", fetchErr(ctx, timeout, err)
	}
	if uint64(n) > limit {
		return 0, "", fmt.Errorf("%w: %s exceeds the limit of %d bytes", ErrTooLarge, redactString(rawURL), limit)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return 0, "", fmt.Errorf("%w: %s: got %d of %d announced bytes (truncated)", ErrFetch, redactString(rawURL), n, resp.ContentLength)
	}
	if err := f.Sync(); err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// newHTTPClient is the Store's download client: the given transport (or a
// clone of net/http's default, which honours the proxy environment) and
// checkRedirect. Its timeout is the request context's.
func newHTTPClient(rt http.RoundTripper, maxRedirects int, log *slog.Logger) *http.Client {
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	return &http.Client{Transport: rt, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		err := checkRedirect(req, via, maxRedirects)
		if err != nil {
			log.Warn("redirect refused", "url", redact(via[0].URL), "to", redact(req.URL), "hops", len(via), "err", err)
		}
		return err
	}}
}

// checkRedirect allows a redirect only to http or https, never from https
// down to http (a chain that began on https must not become readable and
// changeable on the wire), and at most maxHops times.
func checkRedirect(req *http.Request, via []*http.Request, maxHops int) error {
	switch req.URL.Scheme {
	case "http", "https":
	default:
		return fmt.Errorf("%w: %s redirects to %s: only http and https are fetched", ErrRedirect, redact(via[len(via)-1].URL), redact(req.URL))
	}
	if req.URL.Scheme == "http" && slices.ContainsFunc(via, func(r *http.Request) bool { return r.URL.Scheme == "https" }) {
		return fmt.Errorf("%w: %s redirects from https down to %s", ErrRedirect, redact(via[0].URL), redact(req.URL))
	}
	if len(via) > maxHops {
		return fmt.Errorf("%w: %s: more than %d redirects", ErrRedirect, redact(via[0].URL), maxHops)
	}
	return nil
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
