// Command deploy measures the OS-image deploy path: the appliance's raw
// view of an image served to concurrent deploys against nginx, the
// agent's writer (agent/diskwrite) against bmaptool, and the agent's
// erase levels (agent/erase). bench/deploy.sh builds it and sets up the
// servers and the loop device; bench/README.md says what each figure
// means. Every comparison is interleaved (A, B, A, B, ...) and reported
// as medians with the per-pair ratios. It prints figures and asserts
// nothing.
//
//	deploy image  -out FILE [-size 2GiB] [-data 256MiB]
//	deploy upload -conf admin.conf -name NAME -file FILE [-format raw|qcow2]
//	deploy serve  -map FILE.map.json -url A=URL -url B=URL [-clients 10] [-runs 5] [-mode extents|whole]
//	deploy write  -map FILE.map.json -image FILE -bmap FILE.bmap -url URL -device DEV [-runs 5]
//	deploy erase  -device DEV [-zero-device DEV2] [-runs 3]
//	deploy loopreset -device DEV2
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/agent/diskwrite"
	"github.com/corralhq/corral/agent/erase"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/images/blockmap"
	"github.com/corralhq/corral/images/osimage"
	"github.com/corralhq/corral/internal/diskmap"
)

const mib = 1 << 20

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: deploy image|upload|serve|write|erase|loopreset [flags] (see the package comment)")
		os.Exit(2)
	}
	cmds := map[string]func([]string) error{"image": cmdImage, "upload": cmdUpload, "serve": cmdServe, "write": cmdWrite, "erase": cmdErase, "loopreset": cmdLoopReset}
	run, ok := cmds[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "deploy: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	if err := run(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "deploy %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// cmdImage makes a sparse raw image shaped like an installed system
// (random, incompressible data: a boot area, a few large runs and many
// small scattered blocks, the rest holes) and its block map, built by the
// appliance's own builder (images/blockmap), at FILE.map.json.
func cmdImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ExitOnError)
	out := fs.String("out", "", "image file to create")
	size := fs.Int64("size", 2<<30, "virtual size in bytes")
	data := fs.Int64("data", 256*mib, "bytes of data, about")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits with its usage
	if *out == "" {
		return errors.New("-out is required")
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(*size); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 4*mib)
	write := func(off, n int64) error {
		for n > 0 {
			p := buf[:min(int64(len(buf)), n)]
			for i := range p {
				p[i] = byte(rng.Uint32() | 1) // never an all-zero block
			}
			if _, err := f.WriteAt(p, off); err != nil {
				return err
			}
			off += int64(len(p))
			n -= int64(len(p))
		}
		return nil
	}
	// Half the data in four runs (boot area, root, /usr, the end), half
	// in 1 MiB blocks (the block map's block) scattered over the disk;
	// a scattered block may land on another, so the data is about -data.
	big := *data / 2
	runs := []int64{0, *size / 4, *size / 2, *size - big/4 - mib}
	for _, off := range runs {
		if err := write(off, big/4); err != nil {
			return err
		}
	}
	small := int64(blockmap.BlockSize)
	for range (*data - big) / small {
		off := rng.Int64N(*size/small) * small
		if err := write(off, small); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	im, err := blockmap.Open(*out, blockmap.Raw)
	if err != nil {
		return err
	}
	defer im.Close()
	m, err := im.Map(context.Background())
	if err != nil {
		return err
	}
	enc, _, err := m.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out+".map.json", enc, 0o644); err != nil {
		return err
	}
	fmt.Printf("image %s: %d MiB virtual, %d MiB data in %d extents\n", *out, m.Size/mib, m.DataBytes()/mib, len(m.Extents))
	return nil
}

// cmdUpload uploads FILE through the appliance's gRPC API (UploadOSImage,
// checked against its SHA-256, in the -format given) and waits until it
// is READY.
// It prints the SHA-256.
func cmdUpload(args []string) error {
	fs := flag.NewFlagSet("upload", flag.ExitOnError)
	conf := fs.String("conf", "", "client configuration (corrald's admin.conf)")
	name := fs.String("name", "bench", "OS image name")
	file := fs.String("file", "", "image to upload")
	format := fs.String("format", "raw", "the image's format: raw or qcow2")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits with its usage
	formats := map[string]osimagev1.OSImageFormat{"raw": osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW, "qcow2": osimagev1.OSImageFormat_OS_IMAGE_FORMAT_QCOW2}
	f0, ok := formats[*format]
	if !ok {
		return fmt.Errorf("-format %q: raw or qcow2", *format)
	}
	cc, err := clientconfig.Load(*conf)
	if err != nil {
		return err
	}
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		return err
	}
	defer conn.Close()
	f, err := os.Open(*file)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	ctx := context.Background()
	cl := osimagev1.NewOSImageServiceClient(conn)
	start := time.Now()
	st, err := cl.UploadOSImage(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Header{Header: &osimagev1.UploadOSImageHeader{
		Name: *name, Sha256: sum, SizeBytes: uint64(size), Format: f0}}}); err != nil {
		return err
	}
	buf := make([]byte, osimage.MaxChunk)
	for off := int64(0); off < size; {
		n, err := f.ReadAt(buf, off)
		if n > 0 {
			if err := st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Data{Data: buf[:n]}}); err != nil {
				return fmt.Errorf("send at %d: %w", off, err)
			}
			off += int64(n)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	if _, err := st.CloseAndRecv(); err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		resp, err := cl.GetOSImage(ctx, &osimagev1.GetOSImageRequest{Name: *name})
		if err == nil && resp.GetOsImage().GetState() == osimagev1.OSImageState_OS_IMAGE_STATE_READY {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("OS image %s not READY after 5 minutes: %v %v", *name, resp.GetOsImage().GetState(), err)
		}
	}
	fmt.Fprintf(os.Stderr, "uploaded %s (%s, %d MiB) through the API, READY after %.1f s\n", *name, *format, size/mib, time.Since(start).Seconds())
	fmt.Println(sum)
	return nil
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func loadMap(path string) (*diskmap.Map, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return diskmap.Parse(b, diskmap.Digest(b))
}

// cmdServe runs -clients concurrent deploys against each -url in turn
// (A, B, A, B, ... -runs times each) and prints each run's aggregate MB/s
// (bytes fetched over the wall time of the slowest deploy), the medians
// and the per-pair ratios. A deploy in extents mode fetches the map's
// extents in order, one Range GET each over one keep-alive connection,
// like the agent (agent/diskwrite's HTTPFetch); in whole mode it GETs the
// whole file. Bytes are read and dropped: the clients neither hash nor
// write, so the figure is the server's (and the loopback's).
func cmdServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	var urls multiFlag
	fs.Var(&urls, "url", "LABEL=URL of the image (twice: A and B)")
	mapFile := fs.String("map", "", "block map (FILE.map.json)")
	clients := fs.Int("clients", 10, "concurrent deploys")
	runs := fs.Int("runs", 5, "runs of each server")
	mode := fs.String("mode", "extents", "extents (Range GETs of the map's extents) or whole (one GET of the file)")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits with its usage
	m, err := loadMap(*mapFile)
	if err != nil {
		return err
	}
	if len(urls) == 0 {
		return errors.New("no -url")
	}
	labels := make([]string, len(urls))
	targets := make([]string, len(urls))
	for i, u := range urls {
		l, t, ok := strings.Cut(u, "=")
		if !ok {
			return fmt.Errorf("-url %q: want LABEL=URL", u)
		}
		labels[i], targets[i] = l, t
	}
	fmt.Printf("serve: %d concurrent deploys, mode %s, %d MiB a deploy (%d extents), %d runs each, interleaved; load %s\n",
		*clients, *mode, fetchBytes(m, *mode)/mib, len(m.Extents), *runs, loadavg())
	rates := make([][]float64, len(urls))
	secs := make([][]float64, len(urls))
	for r := range *runs {
		for i := range urls {
			rate, p50, err := serveRun(targets[i], m, *clients, *mode)
			if err != nil {
				return fmt.Errorf("%s run %d: %w", labels[i], r+1, err)
			}
			rates[i] = append(rates[i], rate)
			secs[i] = append(secs[i], p50)
			fmt.Printf("  run %d %-8s %7.0f MB/s aggregate, deploy p50 %.2f s\n", r+1, labels[i], rate, p50)
		}
	}
	summary("MB/s", labels, rates)
	return nil
}

func fetchBytes(m *diskmap.Map, mode string) int64 {
	if mode == "whole" {
		return m.Size
	}
	return m.DataBytes()
}

// serveRun runs clients concurrent deploys and returns the aggregate MB/s
// and the median deploy's seconds. Each deploy dials from a loopback
// address of its own (127.0.10.N), as machines would.
func serveRun(url string, m *diskmap.Map, clients int, mode string) (float64, float64, error) {
	var wg sync.WaitGroup
	errs := make([]error, clients)
	durs := make([]float64, clients)
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 10, byte(c+1))}, Timeout: 10 * time.Second}
			tr := &http.Transport{DialContext: d.DialContext, DisableCompression: true, MaxIdleConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr}
			t0 := time.Now()
			errs[c] = deployFetch(cl, url, m, mode)
			durs[c] = time.Since(t0).Seconds()
		}()
	}
	wg.Wait()
	wall := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	total := float64(fetchBytes(m, mode)) * float64(clients)
	return total / 1e6 / wall, median(durs), nil
}

func deployFetch(cl *http.Client, url string, m *diskmap.Map, mode string) error {
	if mode == "whole" {
		resp, err := cl.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil && (resp.StatusCode != http.StatusOK || n != m.Size) {
			err = fmt.Errorf("GET %s: %s, %d bytes", url, resp.Status, n)
		}
		return err
	}
	fetch := diskwrite.HTTPFetch(cl, url)
	for _, e := range m.Extents {
		rc, err := fetch(context.Background(), e.Offset, e.Length)
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err == nil && n != e.Length {
			err = fmt.Errorf("extent %v: %d bytes", e, n)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// cmdWrite writes the image to -device with each writer in turn, -runs
// times (the device discarded, untimed, before every write so each starts
// from an empty disk): the agent's writer fetching from the appliance
// (-url), the agent's writer reading the local file (the writer alone),
// and bmaptool copy with its own bmap from the local file. It prints
// seconds and MB/s of the virtual size, medians and ratios.
func cmdWrite(args []string) error {
	fs := flag.NewFlagSet("write", flag.ExitOnError)
	mapFile := fs.String("map", "", "block map (FILE.map.json)")
	image := fs.String("image", "", "the raw image file")
	bmap := fs.String("bmap", "", "bmaptool's bmap of the image")
	url := fs.String("url", "", "the appliance's raw view of the image")
	device := fs.String("device", "", "target block device or file")
	runs := fs.Int("runs", 5, "runs of each writer")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits with its usage
	m, err := loadMap(*mapFile)
	if err != nil {
		return err
	}
	src, err := os.Open(*image)
	if err != nil {
		return err
	}
	defer src.Close()
	fileFetch := func(_ context.Context, off, n int64) (io.ReadCloser, error) { //nolint:unparam // diskwrite's fetch signature
		return io.NopCloser(io.NewSectionReader(src, off, n)), nil
	}
	writers := []struct {
		label string
		run   func() error
	}{
		{"agent-http", func() error {
			return diskwrite.Write(context.Background(), diskwrite.Config{Device: *device, Map: m, Fetch: diskwrite.HTTPFetch(http.DefaultClient, *url)})
		}},
		{"agent-file", func() error {
			return diskwrite.Write(context.Background(), diskwrite.Config{Device: *device, Map: m, Fetch: fileFetch})
		}},
		{"bmaptool", func() error {
			out, err := exec.Command("bmaptool", "copy", "--bmap", *bmap, *image, *device).CombinedOutput()
			if err != nil {
				return fmt.Errorf("bmaptool: %w: %s", err, out)
			}
			return nil
		}},
	}
	fmt.Printf("write: %d MiB virtual, %d MiB data, %d extents, to %s (%s), %d runs each, interleaved; load %s\n",
		m.Size/mib, m.DataBytes()/mib, len(m.Extents), *device, describe(*device), *runs, loadavg())
	labels := make([]string, len(writers))
	rates := make([][]float64, len(writers))
	secs := make([][]float64, len(writers))
	for r := range *runs {
		for i, w := range writers {
			labels[i] = w.label
			if err := emptyTarget(*device); err != nil {
				return err
			}
			t0 := time.Now()
			if err := w.run(); err != nil {
				return fmt.Errorf("%s run %d: %w", w.label, r+1, err)
			}
			d := time.Since(t0).Seconds()
			secs[i] = append(secs[i], d)
			rates[i] = append(rates[i], float64(m.Size)/1e6/d)
			fmt.Printf("  run %d %-10s %6.2f s  %6.0f MB/s of the virtual size (%4.0f MB/s of data)\n", r+1, w.label, d, float64(m.Size)/1e6/d, float64(m.DataBytes())/1e6/d)
		}
	}
	summary("s", labels, secs)
	summary("MB/s", labels, rates)
	return nil
}

// emptyTarget discards a block device (blkdiscard) or truncates a file to
// nothing and back to its size, so every write starts from the same
// state.
func emptyTarget(dev string) error {
	st, err := os.Stat(dev)
	if err != nil {
		return err
	}
	if st.Mode().IsRegular() {
		if err := os.Truncate(dev, 0); err != nil {
			return err
		}
		return os.Truncate(dev, st.Size())
	}
	if out, err := exec.Command("blkdiscard", dev).CombinedOutput(); err != nil {
		return fmt.Errorf("blkdiscard %s: %w: %s", dev, err, out)
	}
	return nil
}

func describe(dev string) string {
	base := filepath.Base(dev)
	q := "/sys/block/" + base + "/queue/"
	read := func(n string) string {
		b, _ := os.ReadFile(q + n)
		return strings.TrimSpace(string(b))
	}
	if read("discard_max_bytes") == "" {
		return "a file"
	}
	return fmt.Sprintf("block device, discard_max_bytes %s, write_zeroes_max_bytes %s", read("discard_max_bytes"), read("write_zeroes_max_bytes"))
}

// cmdErase erases through the agent's eraser (agent/erase, the real
// kernel), -runs times each level, interleaved: quick and full on
// -device (full discards there: a loop device over a file that can punch
// holes takes discards), and full on -zero-device, a twin whose queue's
// discard is turned off (sysfs discard_max_bytes 0), which the eraser
// then zeroes (BLKZEROOUT). Then secure, which a loop device refuses,
// with the reason printed. This kernel takes back no other
// discard_max_bytes once it is 0: the script resets -zero-device after
// detaching it (deploy loopreset).
func cmdErase(args []string) error {
	fs := flag.NewFlagSet("erase", flag.ExitOnError)
	device := fs.String("device", "", "whole block device (a loop device)")
	zeroDevice := fs.String("zero-device", "", "a twin of -device whose discard is turned off for the zeroing path")
	runs := fs.Int("runs", 3, "runs of each level")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits with its usage
	size, err := blockSize(*device)
	if err != nil {
		return err
	}
	type level struct {
		label, dev string
		level      inventoryv1.EraseLevel
	}
	levels := []level{
		{"quick", *device, inventoryv1.EraseLevel_ERASE_LEVEL_QUICK},
		{"full", *device, inventoryv1.EraseLevel_ERASE_LEVEL_FULL},
	}
	if *zeroDevice != "" {
		zsize, err := blockSize(*zeroDevice)
		if err != nil {
			return err
		}
		if zsize != size {
			return fmt.Errorf("%s is %d bytes, %s %d: twins must match", *zeroDevice, zsize, *device, size)
		}
		f := "/sys/block/" + filepath.Base(*zeroDevice) + "/queue/discard_max_bytes"
		if err := os.WriteFile(f, []byte("0"), 0); err != nil {
			return fmt.Errorf("turn discard off on %s: %w", *zeroDevice, err)
		}
		levels = append(levels, level{"full-nodiscard", *zeroDevice, inventoryv1.EraseLevel_ERASE_LEVEL_FULL})
	}
	fmt.Printf("erase: %s (%s), %d MiB, %d runs each, interleaved; load %s\n", *device, describe(*device), size/mib, *runs, loadavg())
	e := erase.New(erase.Config{})
	labels := make([]string, len(levels))
	rates := make([][]float64, len(levels))
	for r := range *runs {
		for i, l := range levels {
			labels[i] = l.label
			if err := dirty(l.dev, size); err != nil {
				return err
			}
			var last string
			t0 := time.Now()
			err := e.Erase(context.Background(), &nodev1.ErasePlan{EraseId: "bench", Level: l.level, Disks: []string{l.dev}},
				func(p *nodev1.Progress) {
					if !p.GetDone() {
						last = p.GetDetail() // the disk's own line: how it was erased
					}
				})
			d := time.Since(t0).Seconds()
			if err != nil {
				return fmt.Errorf("%s run %d: %w", l.label, r+1, err)
			}
			rates[i] = append(rates[i], float64(size)/1e6/d)
			fmt.Printf("  run %d %-14s %7.3f s  %8.0f MB/s  (%s)\n", r+1, l.label, d, float64(size)/1e6/d, last)
		}
	}
	summary("MB/s", labels, rates)
	err = e.Erase(context.Background(), &nodev1.ErasePlan{EraseId: "bench", Level: inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, Disks: []string{*device}}, func(*nodev1.Progress) {})
	fmt.Printf("  secure: %v\n", cmpErr(err))
	return nil
}

// cmdLoopReset removes a detached loop device and adds it back
// (LOOP_CTL_REMOVE, LOOP_CTL_ADD), so its queue limits (the discard the
// erase bench turned off) are the kernel's defaults again for whoever
// uses it next.
func cmdLoopReset(args []string) error {
	fs := flag.NewFlagSet("loopreset", flag.ExitOnError)
	device := fs.String("device", "", "a detached loop device, /dev/loopN")
	_ = fs.Parse(args) // ExitOnError: a bad flag exits with its usage
	var n uintptr
	if _, err := fmt.Sscanf(*device, "/dev/loop%d", &n); err != nil {
		return fmt.Errorf("%q is not /dev/loopN", *device)
	}
	f, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.LOOP_CTL_REMOVE, n); errno != 0 {
		return fmt.Errorf("LOOP_CTL_REMOVE %s: %w", *device, errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.LOOP_CTL_ADD, n); errno != 0 {
		return fmt.Errorf("LOOP_CTL_ADD %s: %w", *device, errno)
	}
	return nil
}

func cmpErr(err error) string {
	if err == nil {
		return "carried out (unexpected on a loop device)"
	}
	if errors.Is(err, erase.ErrRefused) {
		return "refused: " + err.Error()
	}
	return "failed: " + err.Error()
}

// dirty writes a signature and scattered data so each erase has
// something to erase (untimed).
func dirty(dev string, size int64) error {
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	p := make([]byte, mib)
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	for _, off := range []int64{0, size / 3, size / 2, size - mib} {
		if _, err := f.WriteAt(p, off); err != nil {
			return err
		}
	}
	return f.Sync()
}

func blockSize(dev string) (int64, error) {
	sectors, err := readSysInt("/sys/block/" + filepath.Base(dev) + "/size")
	if err != nil {
		return 0, fmt.Errorf("%s is not a whole block device: %w", dev, err)
	}
	return sectors * 512, nil
}

func readSysInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var n int64
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// summary prints each label's median (min-max) of unit and, against the
// last label, the median of the per-run ratios.
func summary(unit string, labels []string, vals [][]float64) {
	for i, l := range labels {
		fmt.Printf("  median %-14s %9.2f %s (min %.2f, max %.2f, %d runs)\n", l, median(vals[i]), unit, slices.Min(vals[i]), slices.Max(vals[i]), len(vals[i]))
	}
	last := len(labels) - 1
	for i := range last {
		var ratios []float64
		for r := range min(len(vals[i]), len(vals[last])) {
			ratios = append(ratios, vals[i][r]/vals[last][r])
		}
		fmt.Printf("  ratio %s/%s (%s, median of per-run pairs) %.2f (min %.2f, max %.2f)\n", labels[i], labels[last], unit, median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
