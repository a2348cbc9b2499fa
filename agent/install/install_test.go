package install

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

const mib = 1 << 20

// fakeDisk describes a disk of the fake machine.
type fakeDisk struct {
	name      string
	size      int64
	removable bool
	ro        bool
	model     string
	sector    int
}

// newRoot builds a fake /sys, /dev and /proc under a temporary directory:
// every disk is a sparse regular file at dev/NAME. mounted lists mounted
// /dev names.
func newRoot(t *testing.T, disks []fakeDisk, mounted ...string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range disks {
		base := filepath.Join(root, "sys/block", d.name)
		write(t, filepath.Join(base, "size"), fmt.Sprint(d.size/512))
		write(t, filepath.Join(base, "removable"), map[bool]string{true: "1", false: "0"}[d.removable])
		write(t, filepath.Join(base, "ro"), map[bool]string{true: "1", false: "0"}[d.ro])
		if d.model != "" {
			write(t, filepath.Join(base, "device/model"), d.model+"\n")
		}
		if d.sector != 0 {
			write(t, filepath.Join(base, "queue/logical_block_size"), fmt.Sprint(d.sector))
		}
		f, err := os.Create(filepath.Join(root, "dev", d.name))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(d.size); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	var mounts strings.Builder
	mounts.WriteString("rootfs / rootfs rw 0 0\nproc /proc proc rw 0 0\n")
	for _, m := range mounted {
		fmt.Fprintf(&mounts, "/dev/%s /mnt ext4 rw 0 0\n", m)
		disk := strings.TrimRight(m, "0123456789")
		write(t, filepath.Join(root, "sys/block", disk, m, "partition"), "1")
	}
	write(t, filepath.Join(root, "proc/mounts"), mounts.String())
	write(t, filepath.Join(root, "proc/filesystems"), "nodev\tsysfs\n\text4\n")
	return root
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeSystem stands in for the kernel: a partition "exists" only when the
// disk image holds a valid GPT with a corral-data partition; each
// partition's filesystem is a directory; mount symlinks the mount point
// to it.
type fakeSystem struct {
	t         *testing.T
	root      string
	mu        sync.Mutex
	formatted []string // devices formatted
	rereads   []string
	mounted   map[string]string // mount point → backing directory
}

func newFakeSystem(t *testing.T, root string) *fakeSystem {
	return &fakeSystem{t: t, root: root, mounted: map[string]string{}}
}

func (f *fakeSystem) reread(dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rereads = append(f.rereads, filepath.Base(dev))
	return nil
}

func (f *fakeSystem) partition(_ context.Context, root string, disk Disk, n int) (string, error) {
	c, err := Probe(filepath.Join(root, "dev", disk.Name), disk.Size, disk.SectorSize)
	if err != nil {
		return "", err
	}
	p, ok := c.corralPartition()
	if !ok || p.Number != n {
		return "", fmt.Errorf("no partition %d on %s (found %q)", n, disk.Name, c.String())
	}
	return filepath.Join(root, "dev", fmt.Sprintf("%s%d", disk.Name, n)), nil
}

func (f *fakeSystem) backing(dev string) string {
	return filepath.Join(f.root, "fs", filepath.Base(dev))
}

func (f *fakeSystem) mkfs(_ context.Context, dev, label string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if label != PartitionName {
		f.t.Errorf("mkfs label %q, want %q", label, PartitionName)
	}
	f.formatted = append(f.formatted, filepath.Base(dev))
	if err := os.RemoveAll(f.backing(dev)); err != nil {
		return err
	}
	return os.MkdirAll(f.backing(dev), 0o755)
}

func (f *fakeSystem) mount(dev, dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.backing(dev)
	if _, err := os.Stat(b); err != nil {
		return fmt.Errorf("no filesystem on %s", dev)
	}
	if err := os.Remove(dir); err != nil {
		return err
	}
	f.mounted[dir] = b
	return os.Symlink(b, dir)
}

func (f *fakeSystem) unmount(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mounted[dir]; !ok {
		return errors.New("not mounted")
	}
	delete(f.mounted, dir)
	if err := os.Remove(dir); err != nil {
		return err
	}
	return os.Mkdir(dir, 0o700)
}

// pki is a test CA standing in for the appliance: its sign answers the
// installer's certificate requests (for node, or as the fields say) and
// records each request's public key.
type pki struct {
	t     *testing.T
	node  string
	caPEM string
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey

	mu     sync.Mutex
	keys   []crypto.PublicKey // of the requests, in order
	refuse error              // answer with this error
	cn     string             // sign for this name instead of node
	swap   bool               // certify another key than the request's
	other  *pki               // sign with this CA instead
	raw    string             // answer with this instead of a certificate
}

func newPKI(t *testing.T, node string) *pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	return &pki{t: t, node: node, ca: ca, caKey: caKey, caPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))}
}

// sign is the installer's SignFunc.
func (p *pki) sign(_ context.Context, csrPEM []byte) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		p.t.Errorf("sign got %q, want a PEM CERTIFICATE REQUEST", csrPEM)
		return nil, errors.New("not a request")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || csr.CheckSignature() != nil {
		p.t.Errorf("request: %v", err)
		return nil, errors.New("bad request")
	}
	p.keys = append(p.keys, csr.PublicKey)
	switch {
	case p.refuse != nil:
		return nil, p.refuse
	case p.raw != "":
		return []byte(p.raw), nil
	}
	pub := csr.PublicKey
	if p.swap {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		pub = &k.PublicKey
	}
	ca, caKey := p.ca, p.caKey
	if p.other != nil {
		ca, caKey = p.other.ca, p.other.caKey
	}
	name := p.node
	if p.cn != "" {
		name = p.cn
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(int64(len(p.keys)) + 1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// requests returns the public keys of the requests signed so far.
func (p *pki) requests() []crypto.PublicKey {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]crypto.PublicKey(nil), p.keys...)
}

func plan(p *pki, disk, id string, wipe bool) *nodev1.InstallPlan {
	return &nodev1.InstallPlan{
		Disk: disk, Wipe: wipe, Hostname: "node-1", InstallId: id, MachineName: "m-abc",
		ApplianceEndpoint: "10.0.0.1:20180", CaCertPem: p.caPEM,
	}
}

// install runs in.Install of plan(p, ...) with p as the appliance.
func install(in *Installer, p *pki, disk, id string, wipe bool, rec *recorder) error {
	return in.Install(context.Background(), plan(p, disk, id, wipe), p.sign, rec.add)
}

// identityKey reads the node key written under data and checks it is
// ECDSA P-256 in PKCS#8.
func identityKey(t *testing.T, data string) *ecdsa.PrivateKey {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(data, IdentityDir, NodeKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		t.Fatalf("%s is not a PEM PRIVATE KEY", NodeKeyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		t.Fatalf("node key %T, want ECDSA P-256", k)
	}
	return ek
}

// recorder collects progress.
type recorder struct {
	mu sync.Mutex
	ps []*nodev1.Progress
}

func (r *recorder) add(p *nodev1.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ps = append(r.ps, p)
}

func (r *recorder) steps() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, p := range r.ps {
		s = append(s, p.GetStep())
	}
	return s
}

func (r *recorder) last() *nodev1.Progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ps[len(r.ps)-1]
}

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func newTestInstaller(t *testing.T, root string) (*Installer, *fakeSystem) {
	sys := newFakeSystem(t, root)
	return New(Config{Root: root, TempDir: t.TempDir(), Now: func() time.Time { return now }, sys: sys}), sys
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestInstallBlankDisk(t *testing.T) {
	root := newRoot(t, []fakeDisk{
		{name: "vda", size: 64 * mib, model: "small"},
		{name: "vdb", size: 128 * mib, model: "QEMU HARDDISK"},
		{name: "sr0", size: 512 * mib},
		{name: "sdc", size: 256 * mib, removable: true},
	})
	in, sys := newTestInstaller(t, root)
	var rec recorder
	p := newPKI(t, "node-1")
	if err := install(in, p, "auto", "inst-1", false, &rec); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{StepDisk, StepPartition, StepFormat, StepCertificate, StepIdentity, StepDone}, rec.steps()); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	for i, pr := range rec.ps {
		if pr.GetInstallId() != "inst-1" || pr.GetError() != "" || pr.GetDone() != (i == len(rec.ps)-1) {
			t.Errorf("progress %d = %v", i, pr)
		}
	}
	if d := rec.ps[0].GetDetail(); !strings.Contains(d, "/dev/vdb") || !strings.Contains(d, "128.0 MiB") {
		t.Errorf("disk detail = %q, want /dev/vdb and its size", d)
	}
	if diff := cmp.Diff([]string{"vdb1"}, sys.formatted); diff != "" {
		t.Errorf("mkfs (-want +got):\n%s", diff)
	}
	c, err := Probe(filepath.Join(root, "dev/vdb"), 128*mib, 512)
	if err != nil {
		t.Fatal(err)
	}
	want := []GPTPartition{{Number: 1, Name: PartitionName, FirstLBA: 2048, LastLBA: 128*mib/512 - 34}}
	if diff := cmp.Diff(want, c.GPT); diff != "" {
		t.Errorf("GPT (-want +got):\n%s", diff)
	}
	// The untouched disk stays untouched.
	if c, _ := Probe(filepath.Join(root, "dev/vda"), 64*mib, 512); !c.Blank() {
		t.Errorf("vda holds %s", c)
	}
	data := filepath.Join(root, "fs/vdb1")
	// The key was made here: the one request the appliance saw is for
	// the key on the disk, and the certificate written is for that key,
	// chains to the plan's CA and names the plan's hostname.
	key := identityKey(t, data)
	if reqs := p.requests(); len(reqs) != 1 || !key.PublicKey.Equal(reqs[0]) {
		t.Fatalf("certificate requests %v, want one for the node key", reqs)
	}
	certPEM, err := os.ReadFile(filepath.Join(data, IdentityDir, NodeCertFile))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := checkNodeCert(plan(p, "auto", "inst-1", false), certPEM, key.Public())
	if err != nil {
		t.Fatalf("written certificate: %v", err)
	}
	fp, _ := KeyFingerprint(key.Public())
	if d := rec.ps[3].GetDetail(); !strings.Contains(d, fp) || !strings.Contains(d, "made on this machine") || !strings.Contains(d, cert.SerialNumber.Text(16)) {
		t.Errorf("certificate detail = %q, want the key's fingerprint %s, where it was made and the serial", d, fp)
	}
	for name, want := range map[string]struct {
		content string // "" for the key, checked above
		mode    os.FileMode
	}{
		NodeKeyFile:  {"", 0o600},
		NodeCertFile: {string(certPEM), 0o644},
		CACertFile:   {p.caPEM, 0o644},
	} {
		path := filepath.Join(data, IdentityDir, name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if want.content != "" && string(b) != want.content {
			t.Errorf("%s differs", name)
		}
		if st, _ := os.Stat(path); st.Mode().Perm() != want.mode {
			t.Errorf("%s mode %v, want %v", name, st.Mode().Perm(), want.mode)
		}
	}
	for _, d := range []string{data, filepath.Join(data, IdentityDir)} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, %v; want 0700", d, st.Mode().Perm(), err)
		}
	}
	a, err := ReadAppliance(data)
	if err != nil {
		t.Fatal(err)
	}
	// A plan without appliance_endpoints (an appliance from before the fleet, 2026-11-24):
	// the list is appliance_endpoint alone.
	if diff := cmp.Diff(Appliance{Endpoint: "10.0.0.1:20180", Endpoints: []string{"10.0.0.1:20180"}, NodeName: "node-1", MachineName: "m-abc", InstallID: "inst-1", InstalledAt: now}, a); diff != "" {
		t.Errorf("appliance.json (-want +got):\n%s", diff)
	}
	if len(sys.mounted) != 0 {
		t.Errorf("left mounted: %v", sys.mounted)
	}
}

// writeForeign puts a partition table or filesystem signature on path.
func writeForeign(t *testing.T, path string, size int64, kind string) {
	t.Helper()
	switch kind {
	case "gpt2":
		if err := writeTable(path, size, 512, func(first, last uint64) []partSpec {
			return []partSpec{{"EFI", first, first + 2047}, {"root", first + 2048, last}}
		}); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	switch kind {
	case "mbr":
		var b [512]byte
		b[446+4], b[462+4] = 0x83, 0x82
		b[510], b[511] = 0x55, 0xAA
		f.WriteAt(b[:], 0)
	case "ext4":
		var sb [1024]byte
		sb[56], sb[57] = 0x53, 0xEF
		sb[0x60] = 0x40 // extents
		f.WriteAt(sb[:], 1024)
	case "xfs":
		f.WriteAt([]byte("XFSB"), 0)
	case "lvm":
		f.WriteAt([]byte("LABELONE"), 512)
	default:
		t.Fatalf("unknown kind %q", kind)
	}
}

func TestInstallRefusesNonBlankDisk(t *testing.T) {
	for name, tc := range map[string]struct {
		kind string
		want string
	}{
		"gpt":  {"gpt2", `disk /dev/vdb holds a GPT with 2 partitions ("EFI", "root"); accept with --wipe to erase it`},
		"mbr":  {"mbr", "disk /dev/vdb holds an MBR partition table with 2 partitions; accept with --wipe to erase it"},
		"ext4": {"ext4", "disk /dev/vdb holds an ext4 filesystem; accept with --wipe to erase it"},
		"xfs":  {"xfs", "disk /dev/vdb holds an XFS filesystem; accept with --wipe to erase it"},
		"lvm":  {"lvm", "disk /dev/vdb holds an LVM physical volume; accept with --wipe to erase it"},
	} {
		t.Run(name, func(t *testing.T) {
			root := newRoot(t, []fakeDisk{{name: "vdb", size: 8 * mib}})
			dev := filepath.Join(root, "dev/vdb")
			writeForeign(t, dev, 8*mib, tc.kind)
			before := fileSum(t, dev)
			in, sys := newTestInstaller(t, root)
			var rec recorder
			p := newPKI(t, "node-1")
			err := install(in, p, "/dev/vdb", "inst-1", false, &rec)
			var nb *NotBlankError
			if !errors.As(err, &nb) {
				t.Fatalf("Install = %v, want a NotBlankError", err)
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n got %q\nwant %q", err, tc.want)
			}
			if diff := cmp.Diff([]*nodev1.Progress{{Step: StepDisk, Error: tc.want, Done: true, InstallId: "inst-1"}}, rec.ps, cmpProto); diff != "" {
				t.Errorf("progress (-want +got):\n%s", diff)
			}
			if fileSum(t, dev) != before || len(sys.formatted) != 0 || len(sys.rereads) != 0 {
				t.Errorf("something was written: mkfs %v, rereads %v", sys.formatted, sys.rereads)
			}

			// The same plan with wipe installs over it.
			rec = recorder{}
			if err := install(in, p, "vdb", "inst-1", true, &rec); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(rec.ps[0].GetDetail(), "erasing") {
				t.Errorf("disk detail %q does not say it erases", rec.ps[0].GetDetail())
			}
			c, _ := Probe(dev, 8*mib, 512)
			if got := c.String(); got != `a GPT with 1 partition ("corral-data")` {
				t.Errorf("after wipe-install the disk holds %q", got)
			}
		})
	}
}

var cmpProto = cmp.Comparer(func(a, b *nodev1.Progress) bool {
	return a.GetStep() == b.GetStep() && a.GetDetail() == b.GetDetail() && a.GetDone() == b.GetDone() &&
		a.GetError() == b.GetError() && a.GetInstallId() == b.GetInstallId()
})

func TestInstallIdempotent(t *testing.T) {
	root := newRoot(t, []fakeDisk{{name: "vdb", size: 64 * mib}})
	in, sys := newTestInstaller(t, root)
	p := newPKI(t, "node-1")
	var rec recorder
	if err := install(in, p, "auto", "inst-1", false, &rec); err != nil {
		t.Fatal(err)
	}
	key := identityKey(t, filepath.Join(root, "fs/vdb1"))
	// Same install again (the appliance restarted and resent the plan):
	// allowed without wipe, nothing reformatted, and the key made for it
	// is kept: the appliance is asked to sign the same key again.
	rec = recorder{}
	if err := install(in, p, "auto", "inst-1", false, &rec); err != nil {
		t.Fatalf("re-run of the same install: %v", err)
	}
	if diff := cmp.Diff([]string{StepDisk, StepPartition, StepFormat, StepCertificate, StepIdentity, StepDone}, rec.steps()); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	if len(sys.formatted) != 1 {
		t.Errorf("mkfs ran %d times, want once", len(sys.formatted))
	}
	if reqs := p.requests(); len(reqs) != 2 || !key.PublicKey.Equal(reqs[1]) {
		t.Errorf("re-run asked for another key")
	}
	if d := rec.ps[3].GetDetail(); !strings.Contains(d, "kept from this install's identity") {
		t.Errorf("certificate detail of the re-run = %q", d)
	}
	// The same install with wipe keeps the key too.
	if err := install(in, p, "auto", "inst-1", true, &rec); err != nil {
		t.Fatal(err)
	}
	if reqs := p.requests(); len(reqs) != 3 || !key.PublicKey.Equal(reqs[2]) {
		t.Errorf("wipe re-run asked for another key")
	}
	// Another install over it needs wipe, and gets a new key.
	rec = recorder{}
	err := install(in, p, "auto", "inst-2", false, &rec)
	var nb *NotBlankError
	if !errors.As(err, &nb) || !strings.Contains(err.Error(), `a GPT with 1 partition ("corral-data")`) {
		t.Fatalf("other install without wipe = %v, want a NotBlankError", err)
	}
	if err := install(in, p, "auto", "inst-2", true, &rec); err != nil {
		t.Fatal(err)
	}
	a, err := ReadAppliance(filepath.Join(root, "fs/vdb1"))
	if err != nil || a.InstallID != "inst-2" {
		t.Errorf("appliance.json after wiping install = %+v, %v", a, err)
	}
	if len(sys.formatted) != 3 {
		t.Errorf("mkfs ran %d times, want 3", len(sys.formatted))
	}
	if k2 := identityKey(t, filepath.Join(root, "fs/vdb1")); k2.PublicKey.Equal(&key.PublicKey) {
		t.Error("another install kept the old install's key")
	}
}

// TestInstallRefusesBadPlan: a plan that lacks what the node needs, or
// carries key material, is refused before anything is written.
func TestInstallRefusesBadPlan(t *testing.T) {
	good := newPKI(t, "node-1")
	withField := func(num protowire.Number, v string) func(*nodev1.InstallPlan) {
		return func(p *nodev1.InstallPlan) {
			p.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v))
		}
	}
	for name, tc := range map[string]struct {
		edit func(*nodev1.InstallPlan)
		want string
	}{
		"no CA":         {func(p *nodev1.InstallPlan) { p.CaCertPem = "" }, "CA certificate: no PEM certificate"},
		"no hostname":   {func(p *nodev1.InstallPlan) { p.Hostname = "" }, "hostname is empty"},
		"no install id": {func(p *nodev1.InstallPlan) { p.InstallId = "" }, "install_id is empty"},
		"bad endpoint":  {func(p *nodev1.InstallPlan) { p.ApplianceEndpoint = "appliance" }, "want host:port"},
		"bad fleet endpoint": {func(p *nodev1.InstallPlan) { p.ApplianceEndpoints = []string{"10.0.0.1:20180", "b:20180", "c"} },
			`appliance_endpoints[2]: "c": want host:port`},
		"empty fleet endpoint": {func(p *nodev1.InstallPlan) { p.ApplianceEndpoints = []string{""} }, "appliance_endpoints[0]: empty"},
		"9 fleet endpoints": {func(p *nodev1.InstallPlan) {
			p.ApplianceEndpoints = []string{"b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1", "i:1"}
		}, "9 appliance endpoints, at most 8"},
		"a private key":           {withField(5, "-----BEGIN PRIVATE KEY-----"), "carries a node certificate or private key (field 5"},
		"a certificate":           {withField(4, "-----BEGIN CERTIFICATE-----"), "(field 4"},
		"an unknown future field": {withField(99, "x"), ""},
	} {
		t.Run(name, func(t *testing.T) {
			root := newRoot(t, []fakeDisk{{name: "vdb", size: 8 * mib}})
			dev := filepath.Join(root, "dev/vdb")
			before := fileSum(t, dev)
			in, sys := newTestInstaller(t, root)
			pl := plan(good, "auto", "inst-1", true)
			tc.edit(pl)
			var rec recorder
			err := in.Install(context.Background(), pl, good.sign, rec.add)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Install = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrBadIdentity) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Install = %v, want ErrBadIdentity containing %q", err, tc.want)
			}
			if len(rec.ps) != 1 || rec.ps[0].GetStep() != StepIdentity || !rec.ps[0].GetDone() || rec.ps[0].GetError() == "" {
				t.Errorf("progress = %v", rec.ps)
			}
			if fileSum(t, dev) != before || len(sys.formatted) != 0 {
				t.Error("something was written")
			}
		})
	}
}

// TestInstallChecksTheCertificate: a refused request fails the install
// with the appliance's reason; a certificate from another CA, for another
// key or another name is refused; no identity is written either way.
func TestInstallChecksTheCertificate(t *testing.T) {
	other := newPKI(t, "node-1")
	for name, tc := range map[string]struct {
		edit func(*pki)
		want string
	}{
		"refused":         {func(p *pki) { p.refuse = errors.New("the appliance refused the certificate request: not INSTALLING") }, "node certificate: the appliance refused the certificate request: not INSTALLING"},
		"another CA":      {func(p *pki) { p.other = other }, "does not chain to the plan's CA"},
		"another key":     {func(p *pki) { p.swap = true }, "is for another key than the one made on this machine"},
		"another name":    {func(p *pki) { p.cn = "node-2" }, `node certificate is for "node-2", want the plan's hostname "node-1"`},
		"not PEM":         {func(p *pki) { p.raw = "hello" }, "no PEM certificate"},
		"not certificate": {func(p *pki) { p.raw = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n" }, "node certificate from the appliance"},
	} {
		t.Run(name, func(t *testing.T) {
			root := newRoot(t, []fakeDisk{{name: "vdb", size: 8 * mib}})
			in, _ := newTestInstaller(t, root)
			p := newPKI(t, "node-1")
			tc.edit(p)
			var rec recorder
			err := install(in, p, "auto", "inst-1", false, &rec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Install = %v, want an error containing %q", err, tc.want)
			}
			if last := rec.last(); last.GetStep() != StepCertificate || !last.GetDone() || last.GetError() != err.Error() {
				t.Errorf("last progress = %v", last)
			}
			if _, err := os.Stat(filepath.Join(root, "fs/vdb1", IdentityDir)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("identity written: %v", err)
			}
		})
	}
	// No sign function: refused before anything is written.
	root := newRoot(t, []fakeDisk{{name: "vdb", size: 8 * mib}})
	in, sys := newTestInstaller(t, root)
	var rec recorder
	if err := in.Install(context.Background(), plan(other, "auto", "i", false), nil, rec.add); err == nil || len(sys.formatted) != 0 {
		t.Errorf("Install without sign = %v, mkfs %v", err, sys.formatted)
	}
}

func TestInstallNoDisk(t *testing.T) {
	root := newRoot(t, []fakeDisk{{name: "vda", size: 64 * mib, model: "BOOT"}, {name: "sda", size: 8 * mib, removable: true}}, "vda1")
	in, _ := newTestInstaller(t, root)
	var rec recorder
	err := install(in, newPKI(t, "node-1"), "", "i", false, &rec)
	if !errors.Is(err, ErrNoDisk) {
		t.Fatalf("Install = %v, want ErrNoDisk", err)
	}
	for _, want := range []string{"/dev/vda (64.0 MiB, BOOT) [/dev/vda1 is mounted", "/dev/sda (8.0 MiB) [removable]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not list %q", err, want)
		}
	}
	if p := rec.last(); p.GetStep() != StepDisk || !p.GetDone() {
		t.Errorf("progress = %v", p)
	}
}

func TestChooseDisk(t *testing.T) {
	root := newRoot(t, []fakeDisk{
		{name: "vda", size: 100 * mib, model: "boot disk"},
		{name: "vdb", size: 300 * mib},
		{name: "vdc", size: 200 * mib},
		{name: "loop0", size: 900 * mib},
		{name: "zram0", size: 900 * mib},
		{name: "sr0", size: 900 * mib},
		{name: "sdx", size: 900 * mib, removable: true},
		{name: "sdy", size: 900 * mib, ro: true},
		{name: "sdz", size: 0},
		{name: "nvme0n1", size: 250 * mib, sector: 4096},
	}, "vda2")
	disks, err := ListDisks(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		want    string
		got     string
		wantErr string
	}{
		"auto is the largest eligible": {want: "auto", got: "vdb"},
		"empty is auto":                {want: "", got: "vdb"},
		"path":                         {want: "/dev/vdc", got: "vdc"},
		"kernel name":                  {want: "nvme0n1", got: "nvme0n1"},
		"explicit loop is allowed":     {want: "/dev/loop0", got: "loop0"},
		"unknown":                      {want: "/dev/vdq", wantErr: "/dev/vdq is not a whole disk on this machine; disks present: /dev/loop0 (900.0 MiB) [virtual device], "},
		"a partition":                  {want: "/dev/vda2", wantErr: "is not a whole disk"},
		"mounted":                      {want: "vda", wantErr: "/dev/vda is in use: /dev/vda2 is mounted"},
		"read-only":                    {want: "sdy", wantErr: "/dev/sdy is read-only"},
		"no medium":                    {want: "sdz", wantErr: "/dev/sdz has no medium"},
	} {
		t.Run(name, func(t *testing.T) {
			d, err := ChooseDisk(disks, tc.want)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrNoDisk) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ChooseDisk(%q) = %v, %v; want error containing %q", tc.want, d.Name, err, tc.wantErr)
				}
				return
			}
			if err != nil || d.Name != tc.got {
				t.Fatalf("ChooseDisk(%q) = %q, %v; want %q", tc.want, d.Name, err, tc.got)
			}
		})
	}
	var nvme Disk
	for _, d := range disks {
		if d.Name == "nvme0n1" {
			nvme = d
		}
	}
	if nvme.SectorSize != 4096 || nvme.Size != 250*mib {
		t.Errorf("nvme0n1 = %+v", nvme)
	}
}

func TestGPT4KSectors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk")
	f, _ := os.Create(path)
	f.Truncate(64 * mib)
	f.Close()
	if err := WriteGPT(path, 64*mib, 4096); err != nil {
		t.Fatal(err)
	}
	c, err := Probe(path, 64*mib, 4096)
	if err != nil {
		t.Fatal(err)
	}
	want := []GPTPartition{{Number: 1, Name: PartitionName, FirstLBA: 256, LastLBA: 64*mib/4096 - 6}}
	if diff := cmp.Diff(want, c.GPT); diff != "" {
		t.Errorf("GPT (-want +got):\n%s", diff)
	}
	// Read as a 512-byte-sector disk there is no primary GPT at sector 1.
	if c, _ := Probe(path, 64*mib, 512); c.GPT != nil {
		t.Errorf("4K GPT read as 512: %v", c.GPT)
	}
	// The backup alone is still recognised.
	b := make([]byte, 4096)
	g, _ := os.OpenFile(path, os.O_WRONLY, 0)
	g.WriteAt(b, 4096)
	g.Close()
	if c, _ := Probe(path, 64*mib, 4096); c.String() != "a backup GPT with 1 partition" {
		t.Errorf("primary erased: %q", c)
	}
}

func TestWipe(t *testing.T) {
	root := newRoot(t, []fakeDisk{{name: "vda", size: 64 * mib}, {name: "vdb", size: 64 * mib}})
	in, sys := newTestInstaller(t, root)
	var rec recorder
	// Nothing to wipe automatically yet.
	if err := in.Wipe(context.Background(), &nodev1.WipePlan{InstallId: "w0"}, rec.add); !errors.Is(err, ErrNoDisk) {
		t.Fatalf("Wipe(auto) on blank disks = %v, want ErrNoDisk", err)
	}
	if err := install(in, newPKI(t, "node-1"), "vdb", "inst-1", false, &rec); err != nil {
		t.Fatal(err)
	}
	writeForeign(t, filepath.Join(root, "dev/vda"), 64*mib, "ext4")
	rec = recorder{}
	if err := in.Wipe(context.Background(), &nodev1.WipePlan{Disk: "auto", InstallId: "w1"}, rec.add); err != nil {
		t.Fatal(err)
	}
	want := []*nodev1.Progress{{Step: StepWipe, Detail: `wiped /dev/vdb (64.0 MiB) (held a GPT with 1 partition ("corral-data"))`, Done: true, InstallId: "w1"}}
	if diff := cmp.Diff(want, rec.ps, cmpProto); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
	if c, _ := Probe(filepath.Join(root, "dev/vdb"), 64*mib, 512); !c.Blank() {
		t.Errorf("vdb after wipe holds %s", c)
	}
	if c, _ := Probe(filepath.Join(root, "dev/vda"), 64*mib, 512); c.Blank() {
		t.Error("vda was wiped too")
	}
	if got := sys.rereads[len(sys.rereads)-1]; got != "vdb" {
		t.Errorf("last re-read %q, want vdb", got)
	}
	// Explicit disk.
	if err := in.Wipe(context.Background(), &nodev1.WipePlan{Disk: "/dev/vda", InstallId: "w2"}, rec.add); err != nil {
		t.Fatal(err)
	}
	if c, _ := Probe(filepath.Join(root, "dev/vda"), 64*mib, 512); !c.Blank() {
		t.Errorf("vda after wipe holds %s", c)
	}
}

// TestInstallWritesFleetEndpoints: the identity names every appliance of
// the plan, appliance_endpoint first, and the progress says so.
func TestInstallWritesFleetEndpoints(t *testing.T) {
	root := newRoot(t, []fakeDisk{{name: "vdb", size: 64 * mib}})
	in, _ := newTestInstaller(t, root)
	p := newPKI(t, "node-1")
	pl := plan(p, "auto", "inst-1", false)
	pl.ApplianceEndpoints = []string{"10.0.0.1:20180", "10.0.0.2:20180", "appliance-c.example:20180"}
	var rec recorder
	if err := in.Install(context.Background(), pl, p.sign, rec.add); err != nil {
		t.Fatal(err)
	}
	a, err := ReadAppliance(filepath.Join(root, "fs/vdb1"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pl.ApplianceEndpoints, a.Endpoints); diff != "" {
		t.Errorf("appliance.json endpoints (-want +got):\n%s", diff)
	}
	if a.Endpoint != "10.0.0.1:20180" {
		t.Errorf("appliance.json endpoint %q", a.Endpoint)
	}
	var detail string
	for _, pr := range rec.ps {
		if pr.GetStep() == StepIdentity {
			detail = pr.GetDetail()
		}
	}
	if want := "appliance 10.0.0.1:20180, 10.0.0.2:20180, appliance-c.example:20180"; !strings.Contains(detail, want) {
		t.Errorf("identity progress %q lacks %q", detail, want)
	}
}

func TestPlanEndpoints(t *testing.T) {
	for name, tc := range map[string]struct {
		first   string
		list    []string
		want    []string
		wantErr string
	}{
		"before the fleet":   {first: "a:1", want: []string{"a:1"}},
		"first in list":      {first: "a:1", list: []string{"a:1", "b:1"}, want: []string{"a:1", "b:1"}},
		"first not listed":   {first: "a:1", list: []string{"b:1", "c:1"}, want: []string{"a:1", "b:1", "c:1"}},
		"first listed later": {first: "b:1", list: []string{"a:1", "b:1", "c:1"}, want: []string{"b:1", "a:1", "c:1"}},
		"repeats once":       {first: "a:1", list: []string{"b:1", "b:1", "a:1"}, want: []string{"a:1", "b:1"}},
		"eight":              {first: "a:1", list: []string{"b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1"}, want: []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1"}},
		"nine":               {first: "a:1", list: []string{"b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1", "i:1"}, wantErr: "9 appliance endpoints, at most 8"},
		"no first":           {list: []string{"a:1"}, wantErr: "appliance endpoint: empty"},
		"bad element":        {first: "a:1", list: []string{"b:1", "c d:1"}, wantErr: "appliance_endpoints[1]"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := PlanEndpoints(&nodev1.InstallPlan{ApplianceEndpoint: tc.first, ApplianceEndpoints: tc.list})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("PlanEndpoints = %v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestReadAppliance(t *testing.T) {
	for name, tc := range map[string]struct {
		json    string
		want    Appliance
		wantErr string
	}{
		"full": {json: `{"endpoint":"10.0.0.1:20180","node_name":"n1","machine_name":"m","install_id":"i","installed_at":"2026-11-21T12:00:00Z"}`,
			want: Appliance{Endpoint: "10.0.0.1:20180", NodeName: "n1", MachineName: "m", InstallID: "i", InstalledAt: now}},
		"unknown fields ignored": {json: `{"endpoint":"[fd00::1]:20180","node_name":"n1","extra":1}`, want: Appliance{Endpoint: "[fd00::1]:20180", NodeName: "n1"}},
		"no endpoint":            {json: `{"node_name":"n1"}`, wantErr: "endpoint"},
		"fleet": {json: `{"endpoint":"a:1","endpoints":["a:1","b:2"],"node_name":"n1"}`,
			want: Appliance{Endpoint: "a:1", Endpoints: []string{"a:1", "b:2"}, NodeName: "n1"}},
		"bad fleet endpoint": {json: `{"endpoint":"a:1","endpoints":["a:1","b"],"node_name":"n1"}`, wantErr: `endpoints[1]: "b": want host:port`},
		"9 fleet endpoints": {json: `{"endpoint":"a:1","endpoints":["a:1","b:1","c:1","d:1","e:1","f:1","g:1","h:1","i:1"],"node_name":"n1"}`,
			wantErr: "endpoints: 9, at most 8"},
		"no port": {json: `{"endpoint":"appliance","node_name":"n1"}`, wantErr: "want host:port"},
		"no name": {json: `{"endpoint":"a:1"}`, wantErr: "node_name is empty"},
		"garbage": {json: `{`, wantErr: "appliance.json"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, IdentityDir, ApplianceFile), tc.json)
			got, err := ReadAppliance(dir)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReadAppliance = %+v, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := ReadAppliance(t.TempDir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
	// The node dials Endpoints, or Endpoint in a file from before the fleet (2026-11-24).
	if got := (Appliance{Endpoint: "a:1"}).Appliances(); !slices.Equal(got, []string{"a:1"}) {
		t.Errorf("Appliances without a list = %v", got)
	}
	if got := (Appliance{Endpoint: "a:1", Endpoints: []string{"b:1", "a:1"}}).Appliances(); !slices.Equal(got, []string{"b:1", "a:1"}) {
		t.Errorf("Appliances with a list = %v", got)
	}
}
