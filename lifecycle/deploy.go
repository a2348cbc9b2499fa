package lifecycle

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/layout"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Deploying an operating system (docs/architecture.md, "Deploying an
// operating system").
//
// Deploy checks everything it can before anything changes — who asks
// (the machine's owner or an operator), the machine's state (through
// inventory.Transition on a copy), the OS image (READY, its raw view and
// block map), the layout (parsed and resolved against the machine's disks
// and firmware), the seed's inputs — then pins the boot MAC's address for
// the deployment and makes the machine DEPLOYING in one mutation. The
// DeployPlan goes to the discovery agent at once when it is connected;
// otherwise, with a BMC, the machine is power-cycled into discovery and the
// plan follows on connect; otherwise the timeline says to network-boot it.
//
// Each plan sent carries a fresh phone-home token (32 random bytes,
// base64url) in the seed's vendor-data; the record keeps only the SHA-256
// of the last one sent, so a plan re-sent on reconnect replaces the token
// of the plan before it. The agent's "written" makes boot intent LOCAL (and
// the BMC's next boot the disk, persistently); the deployed OS phoning home
// (phonehome.go) makes the machine DEPLOYED. An error step, no progress
// for DeployTimeout while writing, or no phone-home for DeployBootTimeout
// after written make it FAILED with the reason. The pinned address stays
// with the machine while it is its owner's: release unpins it.

// Deploy defaults (docs/operator-guide.md, "Deploying an operating system").
const (
	DefaultDeployTimeout     = 30 * time.Minute
	DefaultDeployBootTimeout = 15 * time.Minute
	// MaxUserData bounds a deploy's cloud-init user data.
	MaxUserData = 64 << 10
	// MaxSSHKeys and MaxSSHKeyBytes bound a deploy's authorized keys.
	MaxSSHKeys     = 32
	MaxSSHKeyBytes = 8 << 10
	// MaxLayoutBytes bounds a deploy's layout YAML.
	MaxLayoutBytes = 64 << 10
)

// RawImage is a READY OS image as a deploy writes it: its raw bytes at
// Path on the boot HTTP server, its size, and its block map (the
// internal/diskmap JSON) with the map's SHA-256.
type RawImage struct {
	Name, SHA256 string
	Size         int64
	Map          []byte
	MapSHA256    string
	Path         string
}

// OSImages gives a READY OS image's raw view. Raw fails with an error of
// class apierr.ErrNotFound for an unknown image and apierr.ErrPrecondition
// for one that is not READY. Implemented by *osimage.Service through
// appliance.
type OSImages interface {
	Raw(ctx context.Context, name string) (RawImage, error)
}

// Addresses pins the address of a MAC's DHCP lease for a holder, so that
// it is never given to another client while pinned: Pin returns the
// address (with its range's prefix length), the range's gateway and DNS
// servers. Implemented by the DHCP server (boot/dhcp) through appliance.
type Addresses interface {
	Pin(ctx context.Context, mac, holder string) (netip.Prefix, netip.Addr, []netip.Addr, error)
	Unpin(ctx context.Context, mac, holder string) error
}

// DeployServices are what deploys need of the boot side; appliance sets
// them (SetDeploy) once the boot servers and the OS image store exist.
type DeployServices struct {
	// Images is required for a deploy.
	Images OSImages
	// Addresses, when set (DHCP in full mode), pins the boot MAC's address;
	// without it the deployed OS is configured by DHCP and its phone-home
	// is not checked against an address.
	Addresses Addresses
	// BootBase returns the boot HTTP server's base URL ("http://host:port")
	// on host, the address the machine's agent reached this appliance at
	// ("": the boot interface's address). Required for a deploy.
	BootBase func(host string) string
}

// SetDeploy sets the deploy services after New (appliance makes the boot
// servers after the lifecycle). Safe for concurrent use.
func (l *Lifecycle) SetDeploy(d DeployServices) {
	l.deployMu.Lock()
	defer l.deployMu.Unlock()
	l.deploySvc = d
}

func (l *Lifecycle) deployServices() DeployServices {
	l.deployMu.Lock()
	defer l.deployMu.Unlock()
	return l.deploySvc
}

// Deploy outcomes given to Config.DeployOutcome.
const (
	DeployStarted  = "started"
	DeployDeployed = "deployed"
	DeployFailed   = "failed"
	DeployTimedOut = "timed_out"
)

func (l *Lifecycle) deployOutcome(o string) {
	if l.cfg.DeployOutcome != nil {
		l.cfg.DeployOutcome(o)
	}
}

// deployHolder names a deployment's address pin.
func deployHolder(id string) string { return "deployment:" + id }

// Deploy deploys req.OsImage onto machine req.Name for by: its owner or an
// operator (apierr.ErrPermissionDenied for anyone else, as ReleaseMachine;
// an unknown machine is apierr.ErrNotFound). Bad input is apierr.ErrInvalid (user
// data over MaxUserData, a layout that does not parse or asks for disks
// the machine does not have, a bad hostname or key), a machine that cannot
// deploy apierr.ErrPrecondition with the reason; then nothing has changed.
// It returns the machine DEPLOYING. It is the MachineService DeployMachine
// verb (inventory.LifecycleVerbs).
func (l *Lifecycle) Deploy(ctx context.Context, by inventory.Owner, req *inventoryv1.DeployMachineRequest) (*inventoryv1.Machine, error) {
	name := req.GetName()
	m, err := l.inv.GetMachine(ctx, name)
	if err != nil {
		return nil, err
	}
	// A machine another caller holds is PermissionDenied, not hidden: as
	// ReleaseMachine answers (inventory/alloc.go).
	if !by.Operator && !by.Holds(m) {
		return nil, apierr.PermissionDeniedf("machine %q is not allocated to you (%s): allocate it first, or ask an operator", name, by.ID)
	}
	if m.GetState() == inventoryv1.Machine_MAINTENANCE {
		return nil, apierr.Preconditionf("machine %q is in MAINTENANCE: take it out (corral machine maintenance off %s) first", name, name)
	}
	if err := inventory.Transition(&inventoryv1.Machine{Name: name, State: m.GetState(), Allocation: m.GetAllocation()}, inventory.EventDeploying); err != nil {
		return nil, err
	}
	in, err := checkDeployInput(m, req)
	if err != nil {
		return nil, err
	}
	// The seed's own checks (keys that parse, user data that is YAML when
	// it says #cloud-config), before anything changes.
	probe := &inventoryv1.Deployment{DeploymentId: strings.Repeat("0", deploymentIDLen), Hostname: in.hostname, SshKeys: in.keys, UserData: req.GetUserData()}
	if err := deploySeed(m, probe, "http://appliance/phone-home").Validate(); err != nil {
		return nil, classed(fmt.Errorf("deploy: %w", err))
	}
	svc := l.deployServices()
	if svc.Images == nil || svc.BootBase == nil {
		return nil, apierr.Preconditionf("deploy: this appliance serves no OS images to machines (network boot is off: set --boot-interface)")
	}
	img, err := svc.Images.Raw(ctx, req.GetOsImage())
	if err != nil {
		return nil, fmt.Errorf("deploy: OS image %q: %w", req.GetOsImage(), err)
	}
	uefi, firmware := l.firmware(ctx, m)
	lay, err := deployLayout(m, req.GetLayout(), uefi)
	if err != nil {
		return nil, err
	}
	mac := m.GetBootMac()
	if mac == "" {
		return nil, apierr.Preconditionf("machine %q has no boot MAC: it never network-booted", name)
	}
	id := newDeploymentID()
	d := &inventoryv1.Deployment{
		DeploymentId: id, OsImage: img.Name, ImageSha256: img.SHA256, Disk: imageDisk(lay), Layout: lay,
		Hostname: in.hostname, SshKeys: in.keys, UserData: req.GetUserData(), RequestedBy: by.ID,
	}
	if len(d.UserData) > 0 {
		sum := sha256.Sum256(d.UserData)
		d.UserDataSha256 = hex.EncodeToString(sum[:])
	}
	// A deploy again moves the pin from the machine's last deployment to
	// this one (a lease is pinned by one holder at a time); it goes back
	// if this deploy is refused.
	old := ""
	if p := m.GetDeployment(); p.GetAddress() != "" && !p.GetStartedAt().AsTime().Before(m.GetAllocation().GetAllocatedAt().AsTime()) {
		old = p.GetDeploymentId() // of this allocation: still pinned
	}
	pinned := false
	restore := func() {
		ctx := context.WithoutCancel(ctx)
		if pinned {
			if err := svc.Addresses.Unpin(ctx, mac, deployHolder(id)); err != nil {
				l.log.Warn("deploy refused: address not unpinned", "machine", name, "mac", mac, "err", err)
			}
		}
		if old != "" {
			if _, _, _, err := svc.Addresses.Pin(ctx, mac, deployHolder(old)); err != nil {
				l.log.Warn("deploy refused: the last deployment's address pin not restored", "machine", name, "mac", mac, "deployment_id", old, "err", err)
			}
		}
	}
	if svc.Addresses != nil {
		if old != "" {
			if err := svc.Addresses.Unpin(ctx, mac, deployHolder(old)); err != nil {
				return nil, fmt.Errorf("deploy: unpin the address of deployment %s: %w", old, err)
			}
		}
		prefix, gw, dns, err := svc.Addresses.Pin(ctx, mac, deployHolder(id))
		if err != nil {
			restore()
			return nil, fmt.Errorf("deploy: pin the address of %s: %w", mac, err)
		}
		pinned = true
		d.Address = prefix.String()
		if gw.IsValid() {
			d.Gateway = gw.String()
		}
		for _, a := range dns {
			d.Dns = append(d.Dns, a.String())
		}
	}
	now := timestamppb.New(l.now())
	d.StartedAt, d.UpdatedAt = now, now
	m, err = l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if !by.Operator && !by.Holds(m) {
			return apierr.PermissionDeniedf("machine %q is not allocated to you (%s)", name, by.ID)
		}
		if m.GetState() == inventoryv1.Machine_MAINTENANCE {
			return apierr.Preconditionf("machine %q is in MAINTENANCE", name)
		}
		if m.GetDeployment().GetDeploymentId() != cmp.Or(old, m.GetDeployment().GetDeploymentId()) {
			return apierr.Unavailablef("machine %q: another deploy started meanwhile: try again", name)
		}
		if err := inventory.Transition(m, inventory.EventDeploying); err != nil {
			return err
		}
		m.Deployment = d
		m.StateReason = "deploying " + img.Name + ": " + sentWordDeploy(false)
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
		m.Watchdog = nil
		return nil
	})
	if err != nil {
		if svc.Addresses != nil {
			restore()
		}
		return nil, err
	}
	l.deployIndex.put(id, name)
	l.deployOutcome(DeployStarted)
	addr := cmp.Or(d.GetAddress(), "by DHCP (no address pinned: the boot network's DHCP is not the appliance's)")
	l.event(m, "lifecycle", "deploying", fmt.Sprintf("deploy %s: image %s (sha256 %s) onto %s; address %s; firmware %s; by %s",
		id, img.Name, shortSum(img.SHA256), d.GetDisk(), addr, firmware, by.ID), map[string]string{"install_id": id, "image": img.Name})
	l.log.Info("deploy started", "machine", name, "deployment_id", id, "image", img.Name, "disk", d.GetDisk(), "address", d.GetAddress(), "firmware", firmware)
	switch {
	case l.sess.connected(name):
		if sm := l.sendDeploy(ctx, m); sm != nil {
			m = sm
		}
	case hasBMC(m) && l.cfg.BMC != nil:
		if err := l.pxeCycle(ctx, m, "deploy: boot into discovery"); err == nil {
			l.armWatchdog(ctx, name, "deploy")
		}
	default:
		l.event(m, "lifecycle", "waiting", "deploy plan waits for the discovery agent: network-boot the machine", map[string]string{"install_id": id})
	}
	return l.inv.GetMachine(ctx, name)
}

// deployInput is a deploy request's checked inputs.
type deployInput struct {
	hostname string
	keys     []string
}

// checkDeployInput checks what a deploy request carries, changing nothing.
func checkDeployInput(m *inventoryv1.Machine, req *inventoryv1.DeployMachineRequest) (deployInput, error) {
	var in deployInput
	if req.GetOsImage() == "" {
		return in, apierr.Invalidf("deploy: name an OS image (--image)")
	}
	if n := len(req.GetUserData()); n > MaxUserData {
		return in, apierr.Invalidf("deploy: user data is %d bytes, more than the %d allowed", n, MaxUserData)
	}
	if n := len(req.GetLayout()); n > MaxLayoutBytes {
		return in, apierr.Invalidf("deploy: layout is %d bytes, more than the %d allowed", n, MaxLayoutBytes)
	}
	if n := len(req.GetSshKeys()); n > MaxSSHKeys {
		return in, apierr.Invalidf("deploy: %d SSH keys, more than the %d allowed", n, MaxSSHKeys)
	}
	for k, key := range req.GetSshKeys() {
		key = strings.TrimSpace(key)
		switch {
		case key == "":
			return in, apierr.Invalidf("deploy: SSH key %d is empty", k+1)
		case len(key) > MaxSSHKeyBytes:
			return in, apierr.Invalidf("deploy: SSH key %d is %d bytes, more than the %d allowed", k+1, len(key), MaxSSHKeyBytes)
		case strings.ContainsAny(key, "\r\n") || termsafe.Has(key):
			return in, apierr.Invalidf("deploy: SSH key %d is not one line of printable text (one key per --ssh-key)", k+1)
		}
		in.keys = append(in.keys, key)
	}
	in.hostname = cmp.Or(req.GetHostname(), m.GetName())
	if err := checkHostname(in.hostname); err != nil {
		return in, err
	}
	return in, nil
}

// checkHostname accepts a DNS name: labels of letters, digits and
// hyphens (not first or last), 1-63 bytes each, 253 at most in all.
func checkHostname(h string) error {
	bad := func(why string) error { return apierr.Invalidf("deploy: hostname %q: %s", termsafe.Escape(h), why) }
	if len(h) > 253 {
		return bad("longer than 253 bytes")
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return bad("each dot-separated label must be 1 to 63 bytes")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return bad("a label may not start or end with a hyphen")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return bad("only letters, digits, hyphens and dots")
			}
		}
	}
	return nil
}

// deployLayout parses raw (empty: the default layout for the machine's
// facts) and resolves it against the machine's disks and firmware.
func deployLayout(m *inventoryv1.Machine, raw string, uefi bool) (*inventoryv1.DiskLayout, error) {
	if len(m.GetFacts().GetDisks()) == 0 {
		return nil, apierr.Preconditionf("machine %q reported no disks: nothing to deploy onto", m.GetName())
	}
	var l *inventoryv1.DiskLayout
	var err error
	if strings.TrimSpace(raw) == "" {
		l, err = layout.Default(m.GetFacts())
	} else {
		l, err = layout.Parse([]byte(raw))
	}
	if err != nil {
		return nil, classed(fmt.Errorf("deploy: %w", err))
	}
	r, err := layout.Resolve(l, m.GetFacts(), uefi)
	if err != nil {
		return nil, classed(fmt.Errorf("deploy onto machine %q: %w", m.GetName(), err))
	}
	return r, nil
}

// classed gives err the class apierr.ErrInvalid unless it has one.
func classed(err error) error {
	for _, c := range []error{apierr.ErrInvalid, apierr.ErrPrecondition, apierr.ErrNotFound, apierr.ErrOutOfRange} {
		if errors.Is(err, c) {
			return err
		}
	}
	return apierr.Invalidf("%v", err)
}

// imageDisk is the device the layout writes the image to: its image
// target when that is a disk, else the first disk.
func imageDisk(l *inventoryv1.DiskLayout) string {
	for _, d := range l.GetDisks() {
		if d.GetName() == l.GetImage() {
			return d.GetDevice()
		}
	}
	if ds := l.GetDisks(); len(ds) > 0 {
		return ds[0].GetDevice()
	}
	return ""
}

// usesESP reports whether the layout has an EFI system partition (the
// machine boots UEFI).
func usesESP(l *inventoryv1.DiskLayout) bool {
	for _, d := range l.GetDisks() {
		for _, p := range d.GetPartitions() {
			if p.GetType() == "esp" {
				return true
			}
		}
	}
	return false
}

// firmware says whether machine m boots UEFI: from its newest DHCP entry
// on the timeline that carries the client architecture (option 93: 0 is
// BIOS, any other value an EFI or HTTP-boot client), and how it knows.
// Without one it assumes UEFI.
func (l *Lifecycle) firmware(ctx context.Context, m *inventoryv1.Machine) (uefi bool, how string) {
	es, err := l.ev.Timeline(ctx, m.GetName(), "", 200)
	if err == nil {
		for k := len(es) - 1; k >= 0; k-- {
			a, ok := es[k].GetAttributes()["arch"]
			if !ok || es[k].GetSource() != "dhcp" {
				continue
			}
			n, err := strconv.Atoi(a)
			if err != nil {
				continue
			}
			if n == 0 {
				return false, "BIOS (DHCP client architecture 0)"
			}
			return true, fmt.Sprintf("UEFI (DHCP client architecture %d)", n)
		}
	}
	return true, "UEFI (assumed: no DHCP client architecture on the timeline)"
}

// deploymentIDLen is the length of a deployment id: 20 hex digits, where
// install and wipe ids have 16, so that a progress message says whose it
// is without a read of the machine.
const deploymentIDLen = 20

func newDeploymentID() string {
	b := make([]byte, deploymentIDLen/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func isDeploymentID(id string) bool { return len(id) == deploymentIDLen }

func shortSum(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

func sentWordDeploy(sent bool) string {
	if sent {
		return "plan sent to the discovery agent"
	}
	return "waiting for the discovery agent"
}

// newPhoneHomeToken returns a random phone-home token (32 bytes,
// base64url) and its SHA-256 in hex.
func newPhoneHomeToken() (token, sum string) {
	b := make([]byte, 32)
	rand.Read(b)
	token = base64.RawURLEncoding.EncodeToString(b)
	return token, tokenSum(token)
}

func tokenSum(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// deploying reports whether m is DEPLOYING with deployment id and its
// image not yet written.
func deploying(m *inventoryv1.Machine, id string) bool {
	d := m.GetDeployment()
	return m.GetState() == inventoryv1.Machine_DEPLOYING && id != "" && d.GetDeploymentId() == id && d.GetWrittenAt() == nil
}
