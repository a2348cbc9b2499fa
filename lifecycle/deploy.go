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
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/layout"
	"github.com/corralhq/corral/lifecycle/nocloud"
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

// sendDeploy renders m's DeployPlan with a fresh phone-home token, records
// the token's hash and when it was sent, and queues it on the machine's
// session. It returns the updated machine, or nil when nothing was sent.
func (l *Lifecycle) sendDeploy(ctx context.Context, m *inventoryv1.Machine) *inventoryv1.Machine {
	name := m.GetName()
	d := m.GetDeployment()
	id := d.GetDeploymentId()
	if !deploying(m, id) {
		return nil
	}
	plan, sum, err := l.deployPlan(ctx, m)
	if err != nil {
		if errors.Is(err, apierr.ErrNotFound) || errors.Is(err, apierr.ErrPrecondition) || errors.Is(err, errImageChanged) {
			l.deployFail(ctx, name, id, DeployFailed, "deploy plan: "+err.Error())
		} else {
			l.log.Warn("deploy plan not rendered: tried again on the next pass", "machine", name, "deployment_id", id, "err", err)
		}
		return nil
	}
	now := timestamppb.New(l.now())
	seen := d.GetSentAt()
	sm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if !deploying(m, id) {
			return errSkip
		}
		// Sent by another path (the reconciler and Deploy, or onConnect)
		// since m was read: that plan's token stands.
		if sent := m.GetDeployment().GetSentAt(); (sent == nil) != (seen == nil) || (sent != nil && !sent.AsTime().Equal(seen.AsTime())) {
			return errSkip
		}
		m.Deployment.PhoneHomeSha256 = sum
		m.Deployment.SentAt = now
		m.StateReason = "deploying " + m.GetDeployment().GetOsImage() + ": " + sentWordDeploy(true)
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("deploy plan not recorded", "machine", name, "deployment_id", id, "err", err)
		}
		return nil
	}
	if err := l.sess.send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Deploy{Deploy: plan}}); err != nil {
		l.log.Info("deploy plan not sent: agent not connected", "machine", name, "deployment_id", id)
		return nil
	}
	l.event(sm, "lifecycle", "deploy-plan-sent", fmt.Sprintf("deploy plan %s sent: image %s from %s onto %s", id, d.GetOsImage(), plan.GetImageUrl(), d.GetDisk()),
		map[string]string{"install_id": id})
	l.log.Info("deploy plan sent", "machine", name, "deployment_id", id)
	return sm
}

// deploySeed is deployment d's cloud-init seed on machine m, phoning
// home to url.
func deploySeed(m *inventoryv1.Machine, d *inventoryv1.Deployment, url string) nocloud.Seed {
	seed := nocloud.Seed{
		InstanceID: d.GetDeploymentId(), Hostname: d.GetHostname(), SSHKeys: d.GetSshKeys(), UserData: d.GetUserData(),
		MAC: m.GetBootMac(), PhoneHomeURL: url,
	}
	if p, err := netip.ParsePrefix(d.GetAddress()); err == nil {
		seed.Address = p
	}
	if g, err := netip.ParseAddr(d.GetGateway()); err == nil {
		seed.Gateway = g
	}
	for _, s := range d.GetDns() {
		if a, err := netip.ParseAddr(s); err == nil {
			seed.DNS = append(seed.DNS, a)
		}
	}
	return seed
}

var errImageChanged = errors.New("the OS image changed since the deploy started")

// deployPlan renders m's DeployPlan and returns it with its phone-home
// token's hash.
func (l *Lifecycle) deployPlan(ctx context.Context, m *inventoryv1.Machine) (*nodev1.DeployPlan, string, error) {
	d := m.GetDeployment()
	svc := l.deployServices()
	if svc.Images == nil || svc.BootBase == nil {
		return nil, "", errors.New("this appliance serves no OS images to machines")
	}
	img, err := svc.Images.Raw(ctx, d.GetOsImage())
	if err != nil {
		return nil, "", fmt.Errorf("OS image %q: %w", d.GetOsImage(), err)
	}
	if img.SHA256 != d.GetImageSha256() {
		return nil, "", fmt.Errorf("OS image %q: %w (sha256 %s, was %s)", d.GetOsImage(), errImageChanged, shortSum(img.SHA256), shortSum(d.GetImageSha256()))
	}
	host, _, err := net.SplitHostPort(l.sess.endpoint(m.GetName()))
	if err != nil {
		host = ""
	}
	base := strings.TrimSuffix(svc.BootBase(host), "/")
	token, sum := newPhoneHomeToken()
	seed := deploySeed(m, d, base+PhoneHomePath+d.GetDeploymentId()+"/"+token)
	md, ud, vd, nc, err := seed.Files()
	if err != nil {
		return nil, "", fmt.Errorf("cloud-init seed: %w", err)
	}
	return &nodev1.DeployPlan{
		DeploymentId: d.GetDeploymentId(), ImageUrl: base + img.Path, ImageSize: img.Size, ImageSha256: img.SHA256,
		BlockMap: img.Map, BlockMapSha256: img.MapSHA256, Layout: d.GetLayout(),
		SeedMetaData: md, SeedUserData: ud, SeedVendorData: vd, SeedNetworkConfig: nc, Reboot: true,
	}, sum, nil
}

// deployFail makes machine name FAILED with reason when it is still
// DEPLOYING deployment id (a CAS); outcome is counted.
func (l *Lifecycle) deployFail(ctx context.Context, name, id, outcome, reason string) bool {
	fm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetState() != inventoryv1.Machine_DEPLOYING || m.GetDeployment().GetDeploymentId() != id {
			return errSkip
		}
		if err := inventory.Transition(m, inventory.EventDeployFailed); err != nil {
			return err
		}
		m.StateReason = reason
		m.Deployment.Error = reason
		m.Deployment.UpdatedAt = timestamppb.New(l.now())
		m.Watchdog = nil
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("deploy failure not recorded", "machine", name, "deployment_id", id, "err", err)
		}
		return false
	}
	l.deployOutcome(outcome)
	l.event(fm, "lifecycle", "deploy-failed", reason, map[string]string{"install_id": id})
	l.log.Warn("deploy failed", "machine", name, "deployment_id", id, "reason", reason)
	return true
}

// deployOnConnect sends a DEPLOYING machine's plan to its agent that just
// connected; it reports whether m is DEPLOYING (nothing else to send it).
func (l *Lifecycle) deployOnConnect(ctx context.Context, m *inventoryv1.Machine) bool {
	if m.GetState() != inventoryv1.Machine_DEPLOYING {
		return false
	}
	l.sendDeploy(ctx, m)
	return true
}

// deployDeliver re-sends a DEPLOYING machine's plan to its agent connected
// here since when the plan has not gone on that session; it reports
// whether m is DEPLOYING.
func (l *Lifecycle) deployDeliver(ctx context.Context, m *inventoryv1.Machine, since time.Time) bool {
	if m.GetState() != inventoryv1.Machine_DEPLOYING {
		return false
	}
	d := m.GetDeployment()
	if d.GetWrittenAt() == nil && (d.GetSentAt() == nil || d.GetSentAt().AsTime().Before(since)) {
		l.sendDeploy(ctx, m)
	}
	return true
}

// deployProgress applies a progress message of machine's current
// deployment (p.InstallId is the deployment id) in one mutation: the step
// and detail; an error makes it FAILED; "written" (done) makes boot intent
// LOCAL, starts the boot timeout and, with a BMC, sets the next boot to
// the disk. It reports whether p was a deployment's (handled).
func (l *Lifecycle) deployProgress(ctx context.Context, machine string, p *nodev1.Progress) bool {
	id := p.GetInstallId()
	if !isDeploymentID(id) {
		return false // an install's or a wipe's: no read spent here
	}
	now := timestamppb.New(l.now())
	var mine, failed, written bool
	var reason string
	um, err := l.inv.UpdateMachine(ctx, machine, func(m *inventoryv1.Machine) error {
		mine, failed, written, reason = false, false, false, ""
		d := m.GetDeployment()
		if d.GetDeploymentId() != id {
			return errSkip
		}
		mine = true
		if !deploying(m, id) {
			return errSkip // late or repeated: the deploy has moved on
		}
		if p.GetStep() != "" {
			d.Step = p.GetStep()
		}
		d.Detail = p.GetDetail()
		d.UpdatedAt = now
		switch {
		case p.GetError() != "":
			failed = true
			reason = fmt.Sprintf("deploy %s: %s", cmp.Or(d.GetStep(), "?"), p.GetError())
			if err := inventory.Transition(m, inventory.EventDeployFailed); err != nil {
				return err
			}
			d.Error = p.GetError()
			m.StateReason = reason
		case p.GetDone():
			written = true
			d.WrittenAt = now
			m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_LOCAL
			m.Watchdog = nil
			m.StateReason = "deploying " + d.GetOsImage() + ": written, booting the OS from its disk; waiting for it to phone home"
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("deploy progress not recorded", "machine", machine, "deployment_id", id, "err", err)
		} else if mine {
			l.log.Info("stale deploy progress ignored", "machine", machine, "deployment_id", id)
		}
		return mine
	}
	attrs := map[string]string{"install_id": id}
	switch {
	case failed:
		l.deployOutcome(DeployFailed)
		l.event(um, "lifecycle", "deploy-failed", reason, attrs)
		l.log.Warn("deploy failed", "machine", machine, "deployment_id", id, "reason", reason)
	case written:
		l.event(um, "lifecycle", "deploy-written", fmt.Sprintf("deploy %s written: boot intent local; the OS has %s to phone home", id, l.cfg.DeployBootTimeout), attrs)
		l.log.Info("deploy written: booting the OS", "machine", machine, "deployment_id", id)
		if hasBMC(um) && l.cfg.BMC != nil {
			req := inventory.BootRequest{Device: inventoryv1.BootDevice_BOOT_DEVICE_DISK, Persistent: true, EFI: usesESP(um.GetDeployment().GetLayout())}
			if err := l.cfg.BMC.SetBootDevice(ctx, machine, req); err != nil {
				l.event(um, "lifecycle", "boot-device-failed", "next boot disk (persistent) through the BMC: "+err.Error(), attrs)
			} else {
				l.event(um, "lifecycle", "boot-device", "next boot disk (persistent) through the BMC", attrs)
			}
		}
	}
	return true
}

// deployTimedOut fails a DEPLOYING machine whose agent reported nothing
// for DeployTimeout while writing, or whose OS did not phone home within
// DeployBootTimeout of written. It reports whether it failed it.
func (l *Lifecycle) deployTimedOut(ctx context.Context, m *inventoryv1.Machine) bool {
	if m.GetState() != inventoryv1.Machine_DEPLOYING {
		return false
	}
	d := m.GetDeployment()
	reason, ok := l.deployExpiry(d)
	if !ok {
		return false
	}
	id := d.GetDeploymentId()
	fm, err := l.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		if m.GetState() != inventoryv1.Machine_DEPLOYING || m.GetDeployment().GetDeploymentId() != id {
			return errSkip
		}
		r, ok := l.deployExpiry(m.GetDeployment())
		if !ok {
			return errSkip
		}
		if err := inventory.Transition(m, inventory.EventDeployFailed); err != nil {
			return err
		}
		reason = r
		m.StateReason = r
		m.Deployment.Error = r
		m.Watchdog = nil
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("deploy timeout not recorded", "machine", m.GetName(), "err", err)
		}
		return false
	}
	l.deployOutcome(DeployTimedOut)
	l.event(fm, "lifecycle", "deploy-failed", reason, map[string]string{"install_id": id})
	l.log.Warn("deploy timed out", "machine", m.GetName(), "deployment_id", id, "reason", reason)
	return true
}

// deployExpiry says whether deployment d is past its timeout, and why.
func (l *Lifecycle) deployExpiry(d *inventoryv1.Deployment) (string, bool) {
	now := l.now()
	if w := d.GetWrittenAt(); w != nil {
		if now.Sub(w.AsTime()) <= l.cfg.DeployBootTimeout {
			return "", false
		}
		return fmt.Sprintf("deploy boot timeout: written at %s, the OS did not phone home within %s",
			w.AsTime().UTC().Format(time.RFC3339), l.cfg.DeployBootTimeout), true
	}
	last := d.GetUpdatedAt()
	if last == nil {
		last = d.GetStartedAt()
	}
	if last == nil || now.Sub(last.AsTime()) <= l.cfg.DeployTimeout {
		return "", false
	}
	switch {
	case d.GetSentAt() == nil:
		return fmt.Sprintf("deploy timeout: no progress within %s (the plan was never delivered: no discovery agent connected)", l.cfg.DeployTimeout), true
	case d.GetStep() == "":
		return fmt.Sprintf("deploy timeout: no progress within %s of the plan", l.cfg.DeployTimeout), true
	default:
		return fmt.Sprintf("deploy timeout: no progress within %s after step %s", l.cfg.DeployTimeout, d.GetStep()), true
	}
}

// UnpinDeployment drops the address pin of m's deployment, if any: the
// release of an allocated machine calls it (the address may then go to
// another client). A machine without a deployment, or an appliance
// without DHCP in full mode, has nothing to drop.
func (l *Lifecycle) UnpinDeployment(ctx context.Context, m *inventoryv1.Machine) error {
	d := m.GetDeployment()
	a := l.deployServices().Addresses
	if a == nil || d.GetAddress() == "" || d.GetDeploymentId() == "" || m.GetBootMac() == "" {
		return nil
	}
	if err := a.Unpin(ctx, m.GetBootMac(), deployHolder(d.GetDeploymentId())); err != nil {
		return fmt.Errorf("machine %q: unpin the address of deployment %s: %w", m.GetName(), d.GetDeploymentId(), err)
	}
	return nil
}

// deployIndex maps deployment ids to machine names for the phone-home
// handler; a miss falls back to a scan of the DEPLOYING machines. Bounded:
// past maxIndexed ids it starts again empty.
type deployIndex struct {
	mu  sync.Mutex
	ids map[string]string
}

const maxIndexed = 4096

func (x *deployIndex) put(id, machine string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ids == nil || len(x.ids) >= maxIndexed {
		x.ids = map[string]string{}
	}
	x.ids[id] = machine
}

func (x *deployIndex) get(id string) (string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	m, ok := x.ids[id]
	return m, ok
}
