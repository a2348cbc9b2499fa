// Package deploy carries out a DeployPlan in the discovery agent: it puts
// an operating-system image on the machine's disk and leaves a cloud-init
// NoCloud seed beside it (docs/architecture.md, "The agent's deploy").
// The steps, each reported as Progress with the plan's deployment_id:
//
//   - "layout": the plan's DiskLayout is checked against the real disks
//     under Root's sys/block before anything is written (each device a
//     whole disk, not mounted — the boot media —, not read-only, at least
//     the size the appliance saw), the block map is parsed against its
//     digest, and the image must fit on its disk with room for the seed.
//   - "image": agent/diskwrite streams the image's extents from the
//     appliance (Range requests), checking each extent's SHA-256, and
//     zeroes the gaps; detail "N MiB of M MiB written", at most every
//     Config.ProgressInterval.
//   - "partition": the image's partition table (MBR or GPT, read and
//     written with go-diskfs) gets its last partition grown to the end of
//     the disk less the seed's SeedSize (1 MiB aligned); a GPT's backup
//     header moves to the disk's real end, with fresh CRCs.
//   - "seed": a FAT16 filesystem labelled CIDATA is made in the free space
//     at the end and filled with the plan's meta-data, user-data,
//     vendor-data and network-config (empty ones are left out), read back
//     and synced; only then is the seed partition added to the table (MBR
//     type 0x0e, FAT16 LBA; GPT Microsoft basic data), so a failure never leaves a
//     table naming a half-written seed. The kernel re-reads the table
//     (BLKRRPART).
//   - "written" (done): the disk is ready to boot.
//
// A partitioned layout (partitions, software RAID, LVM; parted.go) goes
// "layout" (also reading the image's own partition table over HTTP, each
// extent's hash checked, for its root and boot partitions), "partition"
// (the tables with the seed at the end of the first partitioned disk,
// the kernel's re-read, mdadm's arrays, lvm's volume groups and volumes),
// "image" (the image's root partition onto what the layout's image
// names, its boot partition onto every esp), "seed" (mke2fs and mkswap
// for the other filesystems; their mounts reach the OS as cloud-init
// mounts in the seed's vendor-data) and "written".
//
// A failure is one Progress{step, done, error} saying what was already
// written. It imports agent/diskwrite, agent/install (the disks' sysfs
// view), the API and the block map's wire format; never the appliance's
// packages.
package deploy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/agent/coldplug"
	"github.com/corralhq/corral/agent/diskwrite"
	"github.com/corralhq/corral/agent/install"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// The steps of a deploy, as Progress.step carries them.
const (
	StepLayout    = "layout"
	StepImage     = "image"
	StepPartition = "partition"
	StepSeed      = "seed"
	StepWritten   = "written"
)

// SeedSize is the size of the seed partition at the end of the disk;
// SeedLabel is its filesystem's label (cloud-init's NoCloud looks for
// it).
const (
	SeedSize  = 8 << 20
	SeedLabel = "CIDATA"
	alignment = 1 << 20
)

// Errors Deploy wraps.
var (
	// ErrUnsupported: the plan asks for something this agent cannot do
	// (a filesystem other than ext4 or swap, a RAID level other than
	// raid1 or raid10, a disk with sectors other than 512 bytes).
	ErrUnsupported = errors.New("not supported by this agent yet")
	// ErrLayout: the layout does not fit the machine's disks.
	ErrLayout = errors.New("layout does not fit this machine")
	// ErrTable: the image's partition table cannot take the growth or
	// the seed partition.
	ErrTable = errors.New("partition table")
)

// Config configures a Deployer.
type Config struct {
	// Root is where sys/block, proc/mounts and the device paths of the
	// layout are read ("" means "/").
	Root string
	// HTTP fetches the image (plain HTTP from the appliance's boot
	// server); default a client with connect and header timeouts.
	HTTP *http.Client
	// Disks lists the machine's whole disks; default
	// install.ListDisks(Root).
	Disks func() ([]install.Disk, error)
	// ProgressInterval is the least time between two "image" progress
	// reports (default 2 s).
	ProgressInterval time.Duration
	// StallTimeout fails an extent's fetch that receives no byte for
	// that long (default 1 min): a server that stops sending must not
	// hold the agent busy for ever.
	StallTimeout time.Duration
	// Console receives a line per deploy and per warning; nil discards.
	Console io.Writer
	Logger  *slog.Logger

	// Modules loads the kernel modules a layout needs (md_mod, raid1,
	// raid10, dm_mod); default coldplug.KernelLoader. A module that fails
	// to load may be built in: mdadm or lvm then says what is missing.
	Modules interface{ Load(name string) error }
	// NodeTimeout bounds the wait for a device node the kernel makes
	// (a partition after the re-read, an array, a volume); default 10 s.
	NodeTimeout time.Duration

	// Test knobs: diskwrite's attempts and backoff, the kernel's re-read,
	// regular files accepted as disks, the layout tools (mdadm, lvm,
	// mke2fs, mkswap), the partitions' device paths and the arrays'
	// (a test on a host's real md takes numbers no array of the host
	// uses).
	attempts   int
	backoff    time.Duration
	reread     func(dev string) error
	allowFiles bool
	run        func(ctx context.Context, name string, args ...string) error
	partPath   func(disk string, n int) string
	mdPath     func(i int) string
}

// Deployer carries out deploy plans, one at a time.
type Deployer struct {
	cfg Config
	mu  sync.Mutex
}

// New returns a Deployer with cfg's defaults filled in.
func New(cfg Config) *Deployer {
	cfg.Root = cmp.Or(cfg.Root, "/")
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ResponseHeaderTimeout: 60 * time.Second,
			IdleConnTimeout:       90 * time.Second,
			MaxIdleConnsPerHost:   2,
		}}
	}
	if cfg.Disks == nil {
		root := cfg.Root
		cfg.Disks = func() ([]install.Disk, error) { return install.ListDisks(root) }
	}
	cfg.ProgressInterval = cmp.Or(cfg.ProgressInterval, 2*time.Second)
	cfg.StallTimeout = cmp.Or(cfg.StallTimeout, time.Minute)
	if cfg.Console == nil {
		cfg.Console = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.reread == nil {
		cfg.reread = install.Reread
	}
	if cfg.Modules == nil {
		cfg.Modules = coldplug.KernelLoader{}
	}
	cfg.NodeTimeout = cmp.Or(cfg.NodeTimeout, 10*time.Second)
	if cfg.run == nil {
		cfg.run = runCommand
	}
	if cfg.partPath == nil {
		cfg.partPath = partPath
	}
	if cfg.mdPath == nil {
		root := cfg.Root
		cfg.mdPath = func(i int) string { return filepath.Join(root, fmt.Sprintf("dev/md%d", i)) }
	}
	return &Deployer{cfg: cfg}
}

// Deploy carries out plan (see the package comment). It blocks until the
// disk is written or a step failed; progress receives every step, the
// last one with done = true ("written", or the failing step with the
// error and what was already written), and Deploy returns that error.
// ctx ends the image's streaming (the disk then holds part of the
// image). Calls are serialised.
func (d *Deployer) Deploy(ctx context.Context, plan *nodev1.DeployPlan, progress func(*nodev1.Progress)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	id := plan.GetDeploymentId()
	log := d.cfg.Logger.With("deployment", id)
	var written []string
	fail := func(step string, err error) error {
		what := "nothing was written"
		if len(written) > 0 {
			what = "already written: " + strings.Join(written, "; ")
		}
		progress(&nodev1.Progress{Step: step, Done: true, Error: fmt.Sprintf("%v (%s)", err, what), InstallId: id})
		fmt.Fprintf(d.cfg.Console, "corral: deploy %s failed at %s: %v (%s)\n", id, step, err, what)
		log.Warn("deploy failed", "step", step, "err", err, "written", what)
		return fmt.Errorf("deploy %s: %s: %w", id, step, err)
	}

	// layout
	t, lp, err := d.check(ctx, plan)
	if err != nil {
		return fail(StepLayout, err)
	}
	if lp != nil {
		progress(&nodev1.Progress{Step: StepLayout, InstallId: id, Detail: fmt.Sprintf("image %s (%s, %s of data): its %s partition %d (%s) onto %s; %d partitioned disks, %d arrays, %d volume groups",
			short(plan.GetImageSha256()), mib(lp.m.Size), mib(lp.m.DataBytes()), lp.it.scheme, lp.it.root.index, mib(lp.it.root.size), lp.image, len(lp.disks), len(lp.raids), len(lp.groups))})
		fmt.Fprintf(d.cfg.Console, "corral: deploy %s: writing image %s's root filesystem to %s\n", id, short(plan.GetImageSha256()), lp.image)
		return d.deployLayout(ctx, plan, lp, progress, &written, fail)
	}
	progress(&nodev1.Progress{Step: StepLayout, InstallId: id, Detail: fmt.Sprintf("image %s (%s, %s of data) onto %s (%s)",
		short(plan.GetImageSha256()), mib(t.m.Size), mib(t.m.DataBytes()), t.path, mib(t.size))})
	fmt.Fprintf(d.cfg.Console, "corral: deploy %s: writing image %s to %s\n", id, short(plan.GetImageSha256()), t.path)

	// image
	start := time.Now()
	if err := d.writeImage(ctx, plan, t, progress); err != nil {
		written = append(written, "the image on "+t.path+" up to the failing extent (no partition grown, no seed)")
		return fail(StepImage, err)
	}
	written = append(written, "the image on "+t.path)
	log.Info("image written", "device", t.path, "size", t.m.Size, "data_bytes", t.m.DataBytes(), "seconds", time.Since(start).Seconds())

	f, err := os.OpenFile(t.path, os.O_RDWR, 0)
	if err != nil {
		return fail(StepPartition, err)
	}
	defer f.Close()

	// partition
	tbl, err := readTable(f, t.size, t.sector)
	if err != nil {
		return fail(StepPartition, err)
	}
	if err := tbl.grow(f); err != nil {
		return fail(StepPartition, err)
	}
	grown := fmt.Sprintf("%s partition %d grown to %s", tbl.kind(), tbl.lastIndex(), mib(tbl.lastSize()))
	written = append(written, grown)
	progress(&nodev1.Progress{Step: StepPartition, InstallId: id, Detail: fmt.Sprintf("%s; seed partition %d at %s", grown, tbl.seedIndex(), mib(tbl.seedStart()))})

	// seed
	files := seedFiles(plan)
	if err := makeSeed(f, tbl.seedStart(), SeedSize, files); err != nil {
		return fail(StepSeed, fmt.Errorf("make the CIDATA filesystem: %w", err))
	}
	if err := tbl.addSeed(f); err != nil {
		return fail(StepSeed, err)
	}
	written = append(written, fmt.Sprintf("seed partition %d (CIDATA)", tbl.seedIndex()))
	if err := f.Sync(); err != nil {
		return fail(StepSeed, fmt.Errorf("sync %s: %w", t.path, err))
	}
	if t.block {
		if err := d.cfg.reread(t.path); err != nil {
			// The table is on the disk; the kernel sees it at the reboot.
			fmt.Fprintf(d.cfg.Console, "corral: deploy %s: %v\n", id, err)
			log.Warn("partition table re-read failed", "device", t.path, "err", err)
		}
	}
	names := make([]string, 0, len(files))
	for _, sf := range files {
		names = append(names, sf.name)
	}
	progress(&nodev1.Progress{Step: StepSeed, InstallId: id, Detail: fmt.Sprintf("CIDATA on partition %d: %s", tbl.seedIndex(), strings.Join(names, ", "))})

	progress(&nodev1.Progress{Step: StepWritten, Done: true, InstallId: id, Detail: fmt.Sprintf("%s on %s in %.1f s", short(plan.GetImageSha256()), t.path, time.Since(start).Seconds())})
	log.Info("deploy written", "device", t.path, "seconds", time.Since(start).Seconds())
	return nil
}

// every passes report on to diskwrite's progress at most every
// ProgressInterval.
func (d *Deployer) every(report func(done, total int64)) func(done, total int64) {
	last := time.Now()
	return func(n, total int64) {
		if now := time.Now(); now.Sub(last) >= d.cfg.ProgressInterval {
			last = now
			report(n, total)
		}
	}
}

// writeImage streams the image onto t with diskwrite, reporting "image"
// progress at most every ProgressInterval (and at the end).
func (d *Deployer) writeImage(ctx context.Context, plan *nodev1.DeployPlan, t *target, progress func(*nodev1.Progress)) error {
	id := plan.GetDeploymentId()
	report := func(done, total int64) {
		progress(&nodev1.Progress{Step: StepImage, InstallId: id, Detail: fmt.Sprintf("%d MiB of %d MiB written", done>>20, total>>20)})
	}
	report(0, t.m.Size)
	err := diskwrite.Write(ctx, diskwrite.Config{
		Device:   t.path,
		Map:      t.m,
		Fetch:    stallGuard(diskwrite.HTTPFetch(d.cfg.HTTP, plan.GetImageUrl()), d.cfg.StallTimeout),
		Attempts: d.cfg.attempts,
		Backoff:  d.cfg.backoff,
		Log:      d.cfg.Logger,
		Progress: d.every(report),
	})
	if err != nil {
		return err
	}
	report(t.m.Size, t.m.Size)
	return nil
}

// ErrStalled is wrapped when an extent's fetch received nothing for
// Config.StallTimeout.
var ErrStalled = errors.New("image fetch stalled")

// stallGuard wraps fetch so that a response receiving no byte for
// timeout is cancelled and its read fails with ErrStalled (diskwrite then
// retries the extent).
func stallGuard(fetch diskwrite.Fetch, timeout time.Duration) diskwrite.Fetch {
	return func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		ctx, cancel := context.WithCancelCause(ctx)
		timer := time.AfterFunc(timeout, func() { cancel(fmt.Errorf("%w: no byte for %s", ErrStalled, timeout)) })
		rc, err := fetch(ctx, off, length)
		if err != nil {
			timer.Stop()
			cancel(nil)
			if cause := context.Cause(ctx); errors.Is(cause, ErrStalled) {
				return nil, cause
			}
			return nil, err
		}
		return &stallReader{rc: rc, ctx: ctx, cancel: cancel, timer: timer, timeout: timeout}, nil
	}
}

type stallReader struct {
	rc      io.ReadCloser
	ctx     context.Context
	cancel  context.CancelCauseFunc
	timer   *time.Timer
	timeout time.Duration
}

func (r *stallReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	if n > 0 {
		r.timer.Reset(r.timeout)
	}
	if err != nil && err != io.EOF {
		if cause := context.Cause(r.ctx); errors.Is(cause, ErrStalled) {
			return n, cause
		}
	}
	return n, err
}

func (r *stallReader) Close() error {
	r.timer.Stop()
	err := r.rc.Close()
	r.cancel(nil)
	return err
}

// seedFile is one file of the NoCloud seed.
type seedFile struct {
	name string
	data []byte
}

// seedFiles are the plan's non-empty seed files, in NoCloud's order.
func seedFiles(plan *nodev1.DeployPlan) []seedFile {
	var out []seedFile
	for _, f := range []seedFile{
		{"meta-data", plan.GetSeedMetaData()},
		{"user-data", plan.GetSeedUserData()},
		{"vendor-data", plan.GetSeedVendorData()},
		{"network-config", plan.GetSeedNetworkConfig()},
	} {
		if len(f.data) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// mib renders a byte count for a person: "2048 MiB", "512 KiB".
func mib(n int64) string {
	if n >= 1<<20 || n == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// short is the first 12 digits of a hash.
func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return cmp.Or(sha, "(no hash)")
}
