package install

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// Install steps, as api/node/v1 Progress documents them.
const (
	StepDisk        = "disk"
	StepPartition   = "partition"
	StepFormat      = "format"
	StepCertificate = "certificate"
	StepIdentity    = "identity"
	StepDone        = "done"
	StepWipe        = "wipe"
)

// SignFunc asks the appliance to sign csrPEM, the certificate request for
// the node key made on this machine, for the install in progress, and
// returns the certificate PEM (agent/session sends it as a
// CertificateRequest on the session and waits, bounded, for the
// NodeCertificate). An error is the appliance's refusal or the wait's end.
type SignFunc = func(ctx context.Context, csrPEM []byte) (certPEM []byte, err error)

// ModuleLoader loads a kernel module by name (coldplug.KernelLoader).
type ModuleLoader interface {
	Load(name string) error
}

// Config configures an Installer.
type Config struct {
	// Root is where sys/block, proc/mounts, proc/filesystems and dev are
	// read ("" means "/").
	Root string
	// Mkfs is the mke2fs binary; default: mke2fs on PATH, then
	// /usr/sbin/mke2fs, /sbin/mke2fs.
	Mkfs string
	// Modules loads ext4 when proc/filesystems lacks it; nil skips.
	Modules ModuleLoader
	// TempDir is where the data partition is mounted while the identity
	// is written (default os.TempDir()).
	TempDir string
	Logger  *slog.Logger
	// Now stamps appliance.json (default time.Now).
	Now func() time.Time

	sys system // tests replace the kernel
}

// system is what the installer asks of the kernel.
type system interface {
	// reread asks the kernel to re-read the partition table of dev.
	reread(dev string) error
	// partition waits for partition n of disk and returns its device path.
	partition(ctx context.Context, root string, disk Disk, n int) (string, error)
	// mkfs makes an ext4 filesystem labelled label on dev.
	mkfs(ctx context.Context, dev, label string) error
	mount(dev, dir string) error
	unmount(dir string) error
}

// Installer carries out install and wipe plans. Its methods may be called
// from several goroutines; plans run one at a time.
type Installer struct {
	cfg Config
	mu  sync.Mutex
}

// New returns an Installer with cfg's defaults filled in.
func New(cfg Config) *Installer {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.TempDir == "" {
		cfg.TempDir = os.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.sys == nil {
		cfg.sys = kernel{mke2fs: cfg.Mkfs}
	}
	return &Installer{cfg: cfg}
}

// NotBlankError means the target disk holds a partition table or filesystem
// and the plan does not say wipe. Nothing was written.
type NotBlankError struct {
	Disk  string // /dev/vdb
	Found string // "a GPT with 2 partitions"
}

func (e *NotBlankError) Error() string {
	return fmt.Sprintf("disk %s holds %s; accept with --wipe to erase it", e.Disk, e.Found)
}

// Install carries out plan: it checks the plan, chooses the disk,
// refuses a non-blank disk unless plan.wipe (or unless it already holds
// this install's data partition: then partition and filesystem are kept,
// and so is the node key made here for this install), writes the GPT,
// formats the partition, makes the node key (ECDSA P-256) on this
// machine, has sign get its certificate from the appliance, checks it
// (chains to the plan's CA, our public key, CN = the plan's hostname), and
// writes key, certificate and CA as the node identity. The key never
// leaves the machine: only its certificate request does. progress
// receives each step, then "done" with done = true; on failure a single
// Progress with the failing step, the error and done = true, and Install
// returns the error. All progress carries plan.install_id. It blocks until
// finished; ctx bounds the waits (device nodes, mke2fs, the certificate).
func (in *Installer) Install(ctx context.Context, plan *nodev1.InstallPlan, sign SignFunc, progress func(*nodev1.Progress)) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	cfg := in.cfg
	id := plan.GetInstallId()
	log := cfg.Logger.With("install", id)
	send := func(step, detail string) {
		log.Info("install step", "step", step, "detail", detail)
		progress(&nodev1.Progress{Step: step, Detail: detail, InstallId: id})
	}
	fail := func(step string, err error) error {
		log.Error("install failed", "step", step, "err", err)
		progress(&nodev1.Progress{Step: step, Error: err.Error(), Done: true, InstallId: id})
		return err
	}

	if err := checkPlan(plan); err != nil {
		return fail(StepIdentity, err)
	}
	if sign == nil {
		return fail(StepCertificate, errors.New("install: no way to have the node certificate signed"))
	}
	disks, err := ListDisks(cfg.Root)
	if err != nil {
		return fail(StepDisk, err)
	}
	disk, err := ChooseDisk(disks, plan.GetDisk())
	if err != nil {
		return fail(StepDisk, err)
	}
	dev := filepath.Join(cfg.Root, "dev", disk.Name)
	contents, err := Probe(dev, disk.Size, disk.SectorSize)
	if err != nil {
		return fail(StepDisk, err)
	}
	if err := in.ext4(); err != nil {
		return fail(StepDisk, err)
	}

	// A data partition of this same install (the plan was resent) is kept
	// unless the plan says wipe; its node key is kept either way, so the
	// appliance is asked to sign the key it may already have signed.
	reuse := false
	var key *nodeKey
	if _, ok := contents.corralPartition(); ok {
		same, k, err := in.sameInstall(ctx, disk, id)
		if err != nil {
			log.Warn("existing corral-data partition unreadable", "disk", disk.Name, "err", err)
		}
		reuse, key = same && !plan.GetWipe(), k
	}
	if !contents.Blank() && !reuse && !plan.GetWipe() {
		return fail(StepDisk, &NotBlankError{Disk: "/dev/" + disk.Name, Found: contents.String()})
	}
	detail := "/dev/" + disk.String()
	switch {
	case reuse:
		detail += ", already holds this install's data partition"
	case !contents.Blank():
		detail += ", erasing " + contents.String()
	}
	send(StepDisk, detail)

	var part string
	if reuse {
		if part, err = cfg.sys.partition(ctx, cfg.Root, disk, 1); err != nil {
			return fail(StepPartition, err)
		}
		send(StepPartition, fmt.Sprintf("kept %s (GPT partition 1 %q)", part, PartitionName))
		send(StepFormat, fmt.Sprintf("kept the ext4 filesystem on %s", part))
	} else {
		if !contents.Blank() {
			if err := wipeRegions(dev, disk.Size); err != nil {
				return fail(StepPartition, err)
			}
		}
		if err := WriteGPT(dev, disk.Size, disk.SectorSize); err != nil {
			return fail(StepPartition, err)
		}
		if err := cfg.sys.reread(dev); err != nil {
			return fail(StepPartition, err)
		}
		if part, err = cfg.sys.partition(ctx, cfg.Root, disk, 1); err != nil {
			return fail(StepPartition, err)
		}
		send(StepPartition, fmt.Sprintf("GPT with partition 1 %q: %s", PartitionName, part))
		if err := cfg.sys.mkfs(ctx, part, PartitionName); err != nil {
			return fail(StepFormat, err)
		}
		send(StepFormat, fmt.Sprintf("ext4 labelled %q on %s", PartitionName, part))
	}

	// The node key: made here (or kept from this install's identity on
	// the disk, so a resent plan asks to sign the same key again), and
	// only its certificate request leaves the machine.
	how := "kept from this install's identity on the disk"
	if key == nil {
		if key, err = newNodeKey(); err != nil {
			return fail(StepCertificate, err)
		}
		how = "made on this machine"
	}
	fp, err := KeyFingerprint(key.key.Public())
	if err != nil {
		return fail(StepCertificate, err)
	}
	csr, err := key.request(plan.GetHostname())
	if err != nil {
		return fail(StepCertificate, err)
	}
	log.Info("node key ready: asking the appliance to sign it", "key", fp, "origin", how)
	certPEM, err := sign(ctx, csr)
	if err != nil {
		return fail(StepCertificate, fmt.Errorf("node certificate: %w", err))
	}
	cert, err := checkNodeCert(plan, certPEM, key.key.Public())
	if err != nil {
		return fail(StepCertificate, err)
	}
	send(StepCertificate, fmt.Sprintf("node key %s (ECDSA P-256, %s); certificate serial %x for %s until %s signed by the appliance",
		fp, how, cert.SerialNumber, cert.Subject.CommonName, cert.NotAfter.UTC().Format(time.RFC3339)))

	if err := in.withMounted(part, func(dir string) error {
		return writeIdentity(dir, plan, key.pem, certPEM, cfg.Now())
	}); err != nil {
		return fail(StepIdentity, fmt.Errorf("write identity on %s: %w", part, err))
	}
	eps, _ := PlanEndpoints(plan) // checked before anything was written
	send(StepIdentity, fmt.Sprintf("node %s, install %s, appliance %s", plan.GetHostname(), id, strings.Join(eps, ", ")))
	log.Info("install step", "step", StepDone)
	progress(&nodev1.Progress{Step: StepDone, Detail: "installed on /dev/" + disk.Name, Done: true, InstallId: id})
	return nil
}

// sameInstall mounts disk's data partition and reports whether its
// appliance.json names installID, and then the node key written for it
// (nil when there is none or it is unreadable: a new one is made).
func (in *Installer) sameInstall(ctx context.Context, disk Disk, installID string) (bool, *nodeKey, error) {
	part, err := in.cfg.sys.partition(ctx, in.cfg.Root, disk, 1)
	if err != nil {
		return false, nil, err
	}
	same := false
	var key *nodeKey
	err = in.withMounted(part, func(dir string) error {
		a, err := ReadAppliance(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		same = err == nil && a.InstallID == installID
		if same {
			if key, err = readNodeKey(dir); err != nil {
				in.cfg.Logger.Warn("node key of this install unreadable: making a new one", "err", err)
				key = nil
			}
			return nil
		}
		return err
	})
	return same, key, err
}

// withMounted mounts the ext4 partition dev on a temporary directory, runs
// f, syncs and unmounts.
func (in *Installer) withMounted(dev string, f func(dir string) error) (err error) {
	dir, err := os.MkdirTemp(in.cfg.TempDir, "corral-data-")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	if err := in.cfg.sys.mount(dev, dir); err != nil {
		return fmt.Errorf("mount %s: %w", dev, err)
	}
	defer func() {
		if uerr := in.cfg.sys.unmount(dir); uerr != nil && err == nil {
			err = fmt.Errorf("unmount %s: %w", dev, uerr)
		}
	}()
	return f(dir)
}

// ext4 loads the ext4 module when the kernel does not list ext4 yet.
func (in *Installer) ext4() error {
	b, err := os.ReadFile(filepath.Join(in.cfg.Root, "proc/filesystems"))
	if err == nil && hasFilesystem(string(b), "ext4") {
		return nil
	}
	if in.cfg.Modules == nil {
		return nil
	}
	// ext4 needs crc32c for metadata_csum but only as a soft dependency,
	// and the images have no modprobe for the kernel to call: load it
	// first (it may be built in, so a failure is not fatal).
	if err := in.cfg.Modules.Load("crc32c_generic"); err != nil {
		in.cfg.Logger.Debug("crc32c_generic not loaded", "err", err)
	}
	if err := in.cfg.Modules.Load("ext4"); err != nil {
		return fmt.Errorf("load the ext4 module: %w", err)
	}
	return nil
}

func hasFilesystem(procFilesystems, name string) bool {
	for line := range strings.Lines(procFilesystems) {
		f := strings.Fields(line)
		if len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}

// Wipe erases the partition tables and filesystem signatures of plan.disk
// (the first and last MiB) and asks the kernel to re-read the table.
// plan.disk "" or "auto" means the disk holding a corral-data partition.
// A mounted disk is refused. progress receives one "wipe" Progress with
// done = true (and the error on failure).
func (in *Installer) Wipe(_ context.Context, plan *nodev1.WipePlan, progress func(*nodev1.Progress)) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	cfg := in.cfg
	id := plan.GetInstallId()
	fail := func(err error) error {
		cfg.Logger.Error("wipe failed", "install", id, "err", err)
		progress(&nodev1.Progress{Step: StepWipe, Error: err.Error(), Done: true, InstallId: id})
		return err
	}
	disks, err := ListDisks(cfg.Root)
	if err != nil {
		return fail(err)
	}
	var disk Disk
	if want := strings.TrimSpace(plan.GetDisk()); want == "" || want == "auto" {
		var found []Disk
		for _, d := range disks {
			if d.ineligible() != "" {
				continue
			}
			c, err := Probe(filepath.Join(cfg.Root, "dev", d.Name), d.Size, d.SectorSize)
			if _, ok := c.corralPartition(); err == nil && ok {
				found = append(found, d)
			}
		}
		if len(found) != 1 {
			return fail(fmt.Errorf("%w: %d disks hold a %q partition; name the disk to wipe; disks present: %s", ErrNoDisk, len(found), PartitionName, listing(disks)))
		}
		disk = found[0]
	} else if disk, err = ChooseDisk(disks, want); err != nil {
		return fail(err)
	}
	dev := filepath.Join(cfg.Root, "dev", disk.Name)
	contents, err := Probe(dev, disk.Size, disk.SectorSize)
	if err != nil {
		return fail(err)
	}
	if err := wipeRegions(dev, disk.Size); err != nil {
		return fail(err)
	}
	if err := cfg.sys.reread(dev); err != nil {
		return fail(err)
	}
	held := "nothing recognised"
	if !contents.Blank() {
		held = contents.String()
	}
	cfg.Logger.Info("wiped", "install", id, "disk", disk.Name, "held", held)
	progress(&nodev1.Progress{Step: StepWipe, Detail: fmt.Sprintf("wiped /dev/%s (held %s)", disk.String(), held), Done: true, InstallId: id})
	return nil
}
