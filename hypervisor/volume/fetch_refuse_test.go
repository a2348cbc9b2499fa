package volume

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"github.com/google/go-cmp/cmp"
)

// qcow2Image runs the real `qemu-img create -f qcow2` with opts in a fresh
// directory and returns the bytes of the 4 MiB image it made.
func qcow2Image(t *testing.T, opts ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	args := append(append([]string{"create", "-q", "-f", "qcow2"}, opts...), "img.qcow2", "4M")
	for attempt := 1; ; attempt++ {
		cmd := exec.Command("qemu-img", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		// LUKS times its key derivation by the process's CPU time; on a
		// loaded machine the measurement can come out empty ("Unable to
		// get accurate CPU usage"): that is the machine, not the image.
		if attempt < 5 && strings.Contains(string(out), "accurate CPU usage") {
			os.Remove(filepath.Join(dir, "img.qcow2"))
			continue
		}
		t.Fatalf("qemu-img %v: %v %s", args, err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "img.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hostileImages are images a fetch must refuse, each made by real
// qemu-img, with what the error must say.
func hostileImages(t *testing.T) map[string]struct {
	body []byte
	want string
} {
	t.Helper()
	return map[string]struct {
		body []byte
		want string
	}{
		"backing file": {qcow2Image(t, "-u", "-b", "/etc/hostname", "-F", "raw"),
			`backing file "/etc/hostname"`},
		"json backing file": {qcow2Image(t, "-u", "-b", `json:{"driver":"file","filename":"/etc/shadow"}`, "-F", "raw"),
			`backing file "json:{\"driver\":\"file\",\"filename\":\"/etc/shadow\"}"`},
		// A relative data file name resolves beside the image, in the
		// volume directory: the image would read and write another
		// volume. That volume does not exist here, so the refusal must
		// come from the header check, before qemu-img tries to open it.
		"external data file": {qcow2Image(t, "-o", "data_file=other-volume"),
			`external data file "other-volume"`},
		"encrypted": {qcow2Image(t, "--object", "secret,id=s0,data=pw", "-o", "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=100"),
			"encrypted"},
		"malformed qcow2": {append([]byte("QFI\xfb\x00\x00\x00\x03"), make([]byte, 200)...), "malformed qcow2 header"},
		"empty":           {nil, "empty"},
	}
}

// TestFetchRefusesHostileImages: every image that would make QEMU open
// another file (or needs a secret, or is broken) is refused with
// ErrImageRefused (InvalidArgument) naming the reason, and the directory
// is exactly as before. The same for a declared format the file does not
// have.
func TestFetchRefusesHostileImages(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	raw := bytes.Repeat([]byte("corral-raw-disk-"), 1<<16)
	good := qcow2Image(t)
	bodies := map[string][]byte{"/raw.img": raw, "/good.qcow2": good}
	type refusal struct {
		path, format, want string
	}
	cases := map[string]refusal{
		"raw declared qcow2":    {"/raw.img", FormatQcow2, "declared qcow2, but the file has no qcow2 header"},
		"qcow2 declared raw":    {"/good.qcow2", FormatRaw, "declared raw, but the file starts with a qcow2 header"},
		"unknown declaration":   {"/good.qcow2", "vmdk", "format \"vmdk\""},
		"backing json declared": {"/json backing file", FormatQcow2, "backing file"},
	}
	for name, img := range hostileImages(t) {
		p := "/" + name
		bodies[p] = img.body
		cases[name] = refusal{p, "", img.want}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := bodies[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	defer srv.Close()
	os.WriteFile(filepath.Join(s.Dir(), "keep"), []byte("x"), 0o600)
	before := files(t, s)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := s.Fetch(ctx, FetchRequest{Name: "v", URL: srv.URL + strings.ReplaceAll(tc.path, " ", "%20"), Format: tc.format})
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("err %v, want class InvalidArgument", err)
			}
			if tc.format != "vmdk" && !errors.Is(err, ErrImageRefused) {
				t.Errorf("err %v, want ErrImageRefused", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %q does not say %q", err, tc.want)
			}
			t.Logf("refused: %v", err)
			if diff := cmp.Diff(before, files(t, s)); diff != "" {
				t.Errorf("directory changed (-before +after):\n%s", diff)
			}
		})
	}

	// What is declared right, or undeclared and self-contained, is
	// accepted; raw becomes qcow2.
	for name, tc := range map[string]struct {
		path, format, got string
	}{
		"qcow2 declared": {"/good.qcow2", FormatQcow2, FormatQcow2},
		"qcow2 sniffed":  {"/good.qcow2", "", FormatQcow2},
		"raw declared":   {"/raw.img", FormatRaw, FormatQcow2},
		"raw undeclared": {"/raw.img", "", FormatQcow2},
	} {
		v, err := s.Fetch(ctx, FetchRequest{Name: "ok", URL: srv.URL + tc.path, Format: tc.format})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if v.Format != tc.got || v.BackingFile != "" {
			t.Errorf("%s: %+v", name, v)
		}
		if err := s.Delete(ctx, "ok"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFetchRedirectsAndTruncation: redirects to other schemes, from https
// down to http and past the cap are refused (ErrRedirect); a body shorter
// than announced is ErrFetch; redirects within the rules work. Nothing is
// left behind.
func TestFetchRedirectsAndTruncation(t *testing.T) {
	needQemuImg(t)
	ctx := context.Background()
	img := qcow2Image(t)
	var plain, tlsSrv *httptest.Server
	mux := http.NewServeMux()
	mux.HandleFunc("/img", func(w http.ResponseWriter, r *http.Request) { w.Write(img) })
	mux.HandleFunc("/to-file", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "file:///etc/passwd", http.StatusFound)
	})
	mux.HandleFunc("/to-ftp", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "ftp://127.0.0.1/img", http.StatusMovedPermanently)
	})
	mux.HandleFunc("/to-plain", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/img", http.StatusFound)
	})
	mux.HandleFunc("/to-tls", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, tlsSrv.URL+"/img", http.StatusFound)
	})
	// /hops/N redirects N more times, then serves the image.
	mux.HandleFunc("/hops/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.PathValue("n"))
		if n == 0 {
			w.Write(img)
			return
		}
		http.Redirect(w, r, fmt.Sprintf("/hops/%d", n-1), http.StatusFound)
	})
	mux.HandleFunc("/truncated", func(w http.ResponseWriter, r *http.Request) {
		conn, buf := hijack(t, w)
		defer conn.Close()
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(img))
		buf.Write(img[:len(img)/2])
		buf.Flush()
	})
	mux.HandleFunc("/truncated-chunked", func(w http.ResponseWriter, r *http.Request) {
		conn, buf := hijack(t, w)
		defer conn.Close()
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", len(img)/2)
		buf.Write(img[:len(img)/2])
		buf.WriteString("\r\n") // no terminating zero-length chunk
		buf.Flush()
	})
	plain = httptest.NewServer(mux)
	defer plain.Close()
	tlsSrv = httptest.NewTLSServer(mux)
	defer tlsSrv.Close()

	var logs syncbuf.Buffer
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "volumes"), MaxRedirects: 3, Transport: tlsSrv.Client().Transport,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.Dir(), "keep"), []byte("x"), 0o600)
	before := files(t, s)
	for name, tc := range map[string]struct {
		url, want string
		class     error
	}{
		"redirect to file":     {plain.URL + "/to-file", "redirects to file:///etc/passwd", ErrRedirect},
		"redirect to ftp":      {plain.URL + "/to-ftp", "redirects to ftp://127.0.0.1/img", ErrRedirect},
		"https down to http":   {tlsSrv.URL + "/to-plain", "from https down to " + plain.URL, ErrRedirect},
		"too many redirects":   {plain.URL + "/hops/4", "more than 3 redirects", ErrRedirect},
		"redirect loop":        {plain.URL + "/hops/1000", "more than 3 redirects", ErrRedirect},
		"truncated body":       {plain.URL + "/truncated", "truncated", ErrFetch},
		"truncated chunked":    {plain.URL + "/truncated-chunked", "truncated", ErrFetch},
		"tls redirect to file": {tlsSrv.URL + "/to-file", "redirects to file:///etc/passwd", ErrRedirect},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := s.Fetch(ctx, FetchRequest{Name: "v", URL: tc.url})
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %v saying %q", err, tc.class, tc.want)
			}
			t.Logf("refused: %v", err)
			if diff := cmp.Diff(before, files(t, s)); diff != "" {
				t.Errorf("directory changed (-before +after):\n%s", diff)
			}
		})
	}
	if got := strings.Count(logs.String(), `msg="redirect refused"`); got != 6 {
		t.Errorf("%d redirect refusals logged, want 6:\n%s", got, logs.String())
	}
	for name, u := range map[string]string{
		"3 redirects":      plain.URL + "/hops/3",
		"https redirects":  tlsSrv.URL + "/hops/2",
		"http up to https": plain.URL + "/to-tls",
	} {
		if _, err := s.Fetch(ctx, FetchRequest{Name: "ok", URL: u}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s.Delete(ctx, "ok")
	}

	// MaxRedirects < 0: no redirect at all.
	none, err := New(Config{Dir: t.TempDir(), MaxRedirects: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := none.Fetch(ctx, FetchRequest{Name: "v", URL: plain.URL + "/hops/1"}); !errors.Is(err, ErrRedirect) {
		t.Errorf("MaxRedirects -1: %v, want ErrRedirect", err)
	}
}

func hijack(t *testing.T, w http.ResponseWriter) (net.Conn, *bufio.ReadWriter) {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Error(err)
		panic(http.ErrAbortHandler)
	}
	return conn, buf
}

// TestQemuImgAlwaysToldTheFormat runs every Store operation with qemu-img
// behind a recording wrapper: no call may leave a format to qemu-img's
// probe (info, convert, resize and create carry -f; an overlay also -F).
func TestQemuImgAlwaysToldTheFormat(t *testing.T) {
	needQemuImg(t)
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	logFile := filepath.Join(dir, "calls")
	wrapper := filepath.Join(dir, "qemu-img")
	script := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\n' \"$*\" >> %q\nexec %q \"$@\"\n", logFile, qemuImg)
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Dir: filepath.Join(dir, "volumes"), QemuImg: wrapper})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var iso bytes.Buffer
	if err := (cloudinit.Seed{InstanceID: "i", Hostname: "h"}).WriteISO(&iso); err != nil {
		t.Fatal(err)
	}
	bodies := map[string][]byte{
		"/q":   qcow2Image(t),
		"/r":   bytes.Repeat([]byte{1}, 1<<20),
		"/iso": iso.Bytes(),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(bodies[r.URL.Path]) }))
	defer srv.Close()
	steps := []func() error{
		func() error { _, err := s.Create(ctx, "empty", 1<<20); return err },
		func() error { _, err := s.CreateFrom(ctx, "overlay", "empty", 2<<20); return err },
		func() error {
			_, err := s.Fetch(ctx, FetchRequest{Name: "q", URL: srv.URL + "/q", SizeBytes: 8 << 20})
			return err
		},
		func() error {
			_, err := s.Fetch(ctx, FetchRequest{Name: "r", URL: srv.URL + "/r", SizeBytes: 2 << 20})
			return err
		},
		func() error { _, err := s.Fetch(ctx, FetchRequest{Name: "iso", URL: srv.URL + "/iso"}); return err },
		func() error { _, err := s.CreateFrom(ctx, "iso-overlay", "iso", 0); return err },
		func() error { _, err := s.Resize(ctx, "q", 16<<20); return err },
		func() error { _, err := s.List(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	calls := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(calls) < 10 {
		t.Fatalf("only %d qemu-img calls recorded:\n%s", len(calls), b)
	}
	for _, c := range calls {
		args := strings.Fields(c)
		if !hasPair(args, "-f") {
			t.Errorf("qemu-img %s: no -f", c)
		}
		if hasPair(args, "-b") && !hasPair(args, "-F") {
			t.Errorf("qemu-img %s: backing file without -F", c)
		}
	}
	t.Logf("%d qemu-img calls, all with an explicit format", len(calls))
}

// hasPair reports whether flag is followed by a value in args.
func hasPair(args []string, flag string) bool {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return true
		}
	}
	return false
}

// FuzzParseQcow2Header: the header of a downloaded file is network input.
// Whatever the bytes, the parser returns (no panic, no unbounded read),
// and a header it accepts without refusal names no other file. The
// committed corpus holds the first bytes of images real qemu-img made:
// plain v3 and v2, a backing file, a json: backing file, an external data
// file and LUKS encryption.
func FuzzParseQcow2Header(f *testing.F) {
	f.Add([]byte("QFI\xfb"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseQcow2Header(bytes.NewReader(b))
		if err != nil {
			return
		}
		if refuseQcow2(h) == "" && (h.HasBacking || h.HasDataFile || h.Encrypted) {
			t.Fatalf("accepted a header that names another file or a secret: %+v", h)
		}
		if len(h.BackingFile) > 1100 || len(h.DataFile) > 1100 {
			t.Fatalf("unbounded name: %d, %d bytes", len(h.BackingFile), len(h.DataFile))
		}
	})
}

// TestParseQcow2HeaderCorpus checks what the parser reads from the
// committed headers of real images.
func TestParseQcow2HeaderCorpus(t *testing.T) {
	want := map[string]string{
		"plain":       "",
		"v2":          "",
		"backing":     `it has a backing file "base.raw": a fetched image must be self-contained`,
		"jsonbacking": `it has a backing file "json:{\"driver\":\"file\",\"filename\":\"/etc/shadow\"}": a fetched image must be self-contained`,
		"datafile":    `it has an external data file "other-volume": a fetched image must be self-contained`,
		"luks":        "it is encrypted: the node holds no image secrets",
	}
	got := map[string]string{}
	for name := range want {
		b, err := os.ReadFile(filepath.Join("testdata/fuzz/FuzzParseQcow2Header", name))
		if err != nil {
			t.Fatal(err)
		}
		lit, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "go test fuzz v1\n[]byte(")
		if !ok {
			t.Fatalf("%s: not a fuzz corpus file", name)
		}
		data, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		h, err := parseQcow2Header(strings.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got[name] = refuseQcow2(h)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}
}
