package http

// Serving files: the boot profile's artifacts (/images/<name>) and READY
// OS images (/os-images/<sha256>), with ranges, ETags, the timeline's
// download entries and the per-MAC rules the scripts follow too.

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
)

// fileRequest checks what artifact and osImage take from a request: the
// optional ?mac= and the method (GET or HEAD). It answers a refusal itself
// and returns false.
func (s *Server) fileRequest(w http.ResponseWriter, r *http.Request) (mac string, ok bool) {
	if raw := r.URL.Query().Get("mac"); raw != "" {
		m, err := normalizeMAC(raw)
		if err != nil {
			s.refuse(w, r, "", http.StatusBadRequest, err.Error())
			return "", false
		}
		mac = m
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		s.refuse(w, r, mac, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed")
		return "", false
	}
	return mac, true
}

func (s *Server) artifact(w http.ResponseWriter, r *http.Request, name string) {
	mac, ok := s.fileRequest(w, r)
	if !ok {
		return
	}
	if _, ok := s.cfg.Catalog.Lookup(name); !ok {
		s.refuse(w, r, mac, http.StatusNotFound, fmt.Sprintf("%q is not in the image catalog", name))
		return
	}
	f, a, err := s.cfg.Catalog.Open(name)
	if err != nil {
		s.log.Error("catalog file unreadable", "file", name, "err", err)
		s.refuse(w, r, mac, http.StatusInternalServerError, "catalog file unreadable")
		return
	}
	defer f.Close()
	s.serveFile(w, r, mac, f, a, a.SHA256)
}

// osImage serves the stored content of a READY OS image by its SHA-256
// (/os-images/<sha256>), or its raw view (/os-images/<sha256>/raw: what a
// deploy writes to the disk, qcow2 converted as it is read), with Range
// support, as artifact serves catalog files.
func (s *Server) osImage(w http.ResponseWriter, r *http.Request, sum string) {
	mac, ok := s.fileRequest(w, r)
	if !ok {
		return
	}
	sum, raw := strings.CutSuffix(sum, "/raw")
	var (
		content io.ReadSeekCloser
		a       images.Artifact
		err     error
	)
	if raw {
		var size int64
		content, size, err = s.cfg.OSImages.OpenRaw(sum)
		a = images.Artifact{Name: sum + "/raw", Kind: "os-image-raw", Size: size, SHA256: sum}
	} else {
		var f *os.File
		f, a, err = s.cfg.OSImages.Open(sum)
		if err == nil {
			content, a.Kind = f, "os-image"
		}
	}
	switch {
	case errors.Is(err, apierr.ErrInvalid):
		s.refuse(w, r, mac, http.StatusBadRequest, fmt.Sprintf("%q is not a SHA-256 (64 lower-case hex digits)", sum))
		return
	case errors.Is(err, apierr.ErrNotFound):
		s.refuse(w, r, mac, http.StatusNotFound, fmt.Sprintf("no READY OS image with sha256 %q here", sum))
		return
	case errors.Is(err, apierr.ErrPrecondition):
		s.refuse(w, r, mac, http.StatusConflict, fmt.Sprintf("OS image %q cannot be served raw: %v", sum, err))
		return
	case err != nil:
		s.log.Error("OS image unreadable", "sha256", sum, "raw", raw, "err", err)
		s.refuse(w, r, mac, http.StatusInternalServerError, "OS image unreadable")
		return
	}
	defer content.Close()
	etag := a.SHA256
	if raw {
		etag += "-raw" // another representation of the same content
	}
	s.serveFile(w, r, mac, content, a, etag)
}

// serveFile answers a GET or HEAD of content (artifact a, entity tag
// etag) with Range and conditional request support, logs it and puts it
// on mac's timeline.
func (s *Server) serveFile(w http.ResponseWriter, r *http.Request, mac string, content io.ReadSeeker, a images.Artifact, etag string) {
	name := a.Name
	start := time.Now()
	cw := &countingWriter{ResponseWriter: w}
	w.Header().Set("ETag", `"`+etag+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	// ServeContent answers Range and conditional requests; on an *os.File
	// its copy reaches net.TCPConn.ReadFrom, which uses sendfile.
	http.ServeContent(cw, r, "", time.Time{}, content)
	dur := time.Since(start)
	status := cw.status
	if status == 0 {
		status = http.StatusOK
	}
	attrs := map[string]string{"file": name, "kind": string(a.Kind), "bytes": strconv.FormatInt(cw.n, 10), "size": strconv.FormatInt(a.Size, 10),
		"status": strconv.Itoa(status), "duration_ms": strconv.FormatInt(dur.Milliseconds(), 10), "peer": peerIP(r)}
	if rg := r.Header.Get("Range"); rg != "" {
		attrs["range"] = rg
	}
	s.log.Info("artifact served", "mac", mac, "file", name, "status", status, "bytes", cw.n, "duration", dur.String())
	if mac != "" {
		s.cfg.Timeline.Event(mac, "http", "artifact", fmt.Sprintf("served %s (%s, %d bytes in %s)", name, a.Kind, cw.n, dur.Round(time.Millisecond)), attrs)
	}
}

// countingWriter counts body bytes and keeps ReadFrom so that sendfile
// still applies.
type countingWriter struct {
	http.ResponseWriter
	n      int64
	status int
}

func (c *countingWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

func (c *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	var n int64
	var err error
	if rf, ok := c.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(r)
	} else {
		// A writer without ReadFrom (an httptest recorder, a wrapper):
		// copy through Write, hiding c's own ReadFrom from io.Copy.
		n, err = io.Copy(struct{ io.Writer }{c.ResponseWriter}, r)
	}
	c.n += n
	return n, err
}
