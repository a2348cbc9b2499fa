package bmc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// bmcSecretPrefix keys the sealed BMC password of each machine.
const bmcSecretPrefix = store.BMCSecretsPrefix

// Sentinel errors; adapters wrap them so the API edge can map them.
var (
	// ErrAuth: the BMC rejected the credentials.
	ErrAuth = fmt.Errorf("%w: BMC authentication failed", apierr.ErrPrecondition)
	// ErrFailed: the BMC understood the request and refused it.
	ErrFailed = fmt.Errorf("%w: BMC operation failed", apierr.ErrPrecondition)
	// ErrCertificate: a Redfish BMC presented a certificate other than
	// the pinned one, or has none pinned; nothing was sent to it. Errors
	// of this class from BMC calls are *CertificateError.
	ErrCertificate = apierr.New(apierr.ErrPrecondition, "BMC certificate not trusted")
)

// FlagCertificateChanged starts a machine flag set when its Redfish BMC
// presents a certificate other than the pinned one (the poller notices it
// within an interval); it is cleared when the BMC presents the pinned one
// again or the machine is enrolled again.
const FlagCertificateChanged = "bmc-certificate-changed"

// RedfishProviderName is the name the BMC adapter's Redfish provider
// answers as (ipmi.RedfishProviderName; this package does not import ipmi).
// A machine enrolled with protocol auto that was answered by it is a
// Redfish BMC.
const RedfishProviderName = "gofish"

// CertificateError is a refused Redfish BMC certificate.
//
// Pinning: the SHA-256 of the BMC's leaf certificate is stored at enroll
// (Bmc.tls_sha256) — the one the request gives, or else the one the BMC
// presents then (trust on first use) — and every later call accepts only
// that certificate. A BMC enrolled before pinning existed (Redfish, no
// pin, not insecure) is refused rather than pinned at its next call: a
// pin taken silently by the poller at some later hour would trust whoever
// answers then, with nobody watching, and send it the stored password.
// Enrolling it again pins it with an operator at the keyboard.
type CertificateError struct {
	// Pinned is the pinned SHA-256 (lowercase hex); empty when none is.
	Pinned string
	// Presented is the SHA-256 the BMC presented (empty when unknown).
	Presented string
}

func (e *CertificateError) Error() string {
	if e.Pinned == "" {
		return "its Redfish BMC has no pinned certificate (enrolled before BMC certificates were pinned): " +
			"enroll the machine again to pin the certificate the BMC presents, or with --bmc-tls-sha256 HEX to pin a known one (--bmc-insecure opts out)"
	}
	presented := e.Presented
	if presented == "" {
		presented = "none"
	}
	return fmt.Sprintf("BMC certificate changed: pinned sha256 %s, presented %s; re-enroll with --bmc-tls-sha256 %s if this is expected",
		e.Pinned, presented, presented)
}

// Unwrap makes errors.Is(err, ErrCertificate) hold.
func (e *CertificateError) Unwrap() error { return ErrCertificate }

// ParseTLSFingerprint normalises a certificate pin as an operator copies
// it: the SHA-256 of the certificate's DER as 64 hex digits, either case,
// plain or colon-separated by byte (`openssl x509 -noout -fingerprint
// -sha256` prints the latter). It returns lowercase hex without colons.
func ParseTLSFingerprint(s string) (string, error) {
	in := s
	s = strings.ToLower(strings.TrimSpace(s))
	if strings.Contains(s, ":") {
		if len(s) != 95 {
			return "", apierr.Invalidf("certificate fingerprint %q: want the SHA-256 of the certificate as 64 hex digits (colons between bytes allowed)", in)
		}
		for i := 2; i < len(s); i += 3 {
			if s[i] != ':' {
				return "", apierr.Invalidf("certificate fingerprint %q: want the SHA-256 of the certificate as 64 hex digits (colons between bytes allowed)", in)
			}
		}
		s = strings.ReplaceAll(s, ":", "")
	}
	if len(s) != 64 || strings.Trim(s, "0123456789abcdef") != "" {
		return "", apierr.Invalidf("certificate fingerprint %q: want the SHA-256 of the certificate as 64 hex digits (colons between bytes allowed)", in)
	}
	return s, nil
}

// Target says how to reach one machine's BMC. Password is cleartext
// only in memory, for the duration of one call.
type Target struct {
	Host        string
	Port        uint32
	Protocol    inventoryv1.BmcProtocol
	Username    string
	Password    string
	CipherSuite uint32
	Timeout     time.Duration
	// How a Redfish BMC's certificate is checked (IPMI ignores it): at
	// most one of TLSSHA256 (the pin: only that certificate), TLSInsecure
	// (not checked) and TLSFirstUse (enrolment: trust the one presented;
	// Result.TLSSHA256 reports it). None of them: Redfish is refused.
	TLSSHA256   string
	TLSInsecure bool
	TLSFirstUse bool
}

func (t Target) String() string { return net.JoinHostPort(t.Host, strconv.Itoa(int(t.Port))) }

// Result records which provider answered a call, and every provider
// tried.
type Result struct {
	Provider string
	Attempts []*inventoryv1.ProviderAttempt
	Note     string
	// TLSSHA256 is the certificate a Redfish BMC presented during the
	// call (lowercase hex SHA-256 of its DER), whatever the outcome;
	// empty when no TLS handshake got that far.
	TLSSHA256 string
}

// Driver is what BMC control needs of the BMCs themselves; cmd wires the
// ipmi package to it. Errors should wrap ErrAuth, ErrFailed, apierr.ErrInvalid
// or apierr.ErrUnavailable (and the context's error at a deadline); a refused
// certificate is a *CertificateError. Each call must honour ctx and
// t.Timeout, and check a Redfish BMC's certificate as t says.
type Driver interface {
	PowerState(ctx context.Context, t Target) (inventoryv1.PowerState, Result, error)
	SetPower(ctx context.Context, t Target, a inventoryv1.PowerAction) (Result, error)
	SetBootDevice(ctx context.Context, t Target, b inventory.BootRequest) (Result, error)
}

// Sealer seals BMC passwords at rest, bound to associated data.
type Sealer interface {
	Seal(plaintext, ad []byte) ([]byte, error)
	Open(sealed, ad []byte) ([]byte, error)
}

// Machines is what BMC control needs of the inventory: read, create and
// change machine records (each change a compare-and-swap). Implemented by
// *inventory.Inventory.
type Machines interface {
	GetMachine(ctx context.Context, name string) (*inventoryv1.Machine, error)
	MachineByMAC(ctx context.Context, mac string) (*inventoryv1.Machine, error)
	ListMachines(ctx context.Context, req *inventoryv1.ListMachinesRequest) ([]*inventoryv1.Machine, error)
	CreateMachine(ctx context.Context, m *inventoryv1.Machine) (*inventoryv1.Machine, error)
	UpdateMachine(ctx context.Context, name string, mutate func(m *inventoryv1.Machine) error) (*inventoryv1.Machine, error)
	// CreateMachineWith and UpdateMachineWith also write the BMC address
	// binding and the sealed password in the machine's transaction.
	CreateMachineWith(ctx context.Context, m *inventoryv1.Machine, also inventory.Also) (*inventoryv1.Machine, error)
	UpdateMachineWith(ctx context.Context, name string, mutate func(m *inventoryv1.Machine) error, also inventory.Also) (*inventoryv1.Machine, error)
}

// Events is the machines' boot timeline (append only; never blocks).
// Implemented by *inventory.Inventory.
type Events interface {
	Event(mac, source, event, detail string, attrs map[string]string)
}

// Config configures BMC control. Machines, Events, Store, Driver and
// Sealer are required.
type Config struct {
	Machines Machines
	Events   Events
	// Store holds the sealed passwords and the BMC address index
	// (inventory.BMCAddressKey).
	Store  store.Store
	Driver Driver
	Sealer Sealer
	Logger *slog.Logger
	// CallTimeout bounds each BMC call (default 10s).
	CallTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Accounts manages BMC accounts for credential rotation (Rotate);
	// nil refuses rotation.
	Accounts Accounts
	// AccountNames are the two names Corral's own BMC account alternates
	// between (default DefaultAccountNames).
	AccountNames [2]string
	// Health reads BMC sensors and event logs (RefreshHealth); nil
	// disables it.
	Health HealthReader
	// Consoles reads Redfish BMCs' serial console service (SSHConsole);
	// nil refuses Redfish serial consoles.
	Consoles ConsoleReader
	// OnHealth, when set, hears every health read (the metrics); it must
	// be quick.
	OnHealth func(machine string, h Health)
	// OnHealthWrite, when set, hears every machine write a health read
	// made (the bench's store writes per poll).
	OnHealthWrite func()
	// Crash, in tests, is called after each step of a rotation ("pending",
	// "bmc-set", "set", "verified", "committed"); an error stops the
	// rotation there as if the appliance had died.
	Crash func(machine, step string) error
}

// Service enrolls BMCs and drives power and boot device for machines.
// Its methods are safe for concurrent use; every machine change is a CAS
// through Machines.UpdateMachine.
type Service struct {
	inv   Machines
	cfg   Config
	log   *slog.Logger
	locks rotationLocks
}

// New validates cfg and returns BMC control. Forget must run when a
// machine is deleted (cmd wires it to Inventory.OnDelete).
func New(cfg Config) (*Service, error) {
	if cfg.Machines == nil || cfg.Events == nil || cfg.Store == nil || cfg.Driver == nil || cfg.Sealer == nil {
		return nil, errors.New("bmc: Config.Machines, Events, Store, Driver and Sealer are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.AccountNames[0] == "" || cfg.AccountNames[1] == "" || cfg.AccountNames[0] == cfg.AccountNames[1] {
		cfg.AccountNames = DefaultAccountNames
	}
	return &Service{inv: cfg.Machines, cfg: cfg, log: cfg.Logger}, nil
}

func defaultBMCPort(p inventoryv1.BmcProtocol) uint32 {
	if p == inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH {
		return 443
	}
	return 623
}

func (c *Service) timeout(ms uint32) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return c.cfg.CallTimeout
}

// Enroll verifies a BMC's credentials against the BMC, then stores the
// address and the sealed password: on a new machine (created DISCOVERED)
// or on a known one. Nothing is stored when the check fails. A BMC
// address already enrolled on another machine is refused with
// ErrAlreadyExists. It blocks for at most the request's timeout plus
// store time.
//
// A Redfish BMC's certificate is pinned (see CertificateError): the
// request's bmc_tls_sha256 must match what the BMC presents, before any
// credential is sent; without it, enrolling again at the same address
// keeps the pin the machine has, and otherwise the certificate presented
// now is trusted and pinned. bmc_insecure opts out (recorded as
// tls_insecure). Under protocol auto a BMC answered over IPMI gets a pin
// only if a Redfish handshake happened too; without one Redfish is never
// tried for it. Both options are refused for protocol ipmi.
func (c *Service) Enroll(ctx context.Context, req *inventoryv1.EnrollMachineRequest) (*inventoryv1.Machine, error) {
	name := req.GetName()
	if err := inventory.CheckName(name); err != nil {
		return nil, err
	}
	host, port, err := inventory.ParseBMCAddress(req.GetBmcAddress())
	if err != nil {
		return nil, err
	}
	if req.GetBmcPort() != 0 {
		if port != 0 && port != req.GetBmcPort() {
			return nil, apierr.Invalidf("BMC port given twice: %d in the address and %d as bmc_port", port, req.GetBmcPort())
		}
		if req.GetBmcPort() > 65535 {
			return nil, apierr.Invalidf("BMC port %d out of range", req.GetBmcPort())
		}
		port = req.GetBmcPort()
	}
	bproto := req.GetBmcProtocol()
	if _, ok := inventoryv1.BmcProtocol_name[int32(bproto)]; !ok {
		return nil, apierr.Invalidf("BMC protocol %d is not supported: use auto, ipmi or redfish", int32(bproto))
	}
	if port == 0 {
		port = defaultBMCPort(bproto)
	}
	if req.GetBmcUsername() == "" {
		return nil, apierr.Invalidf("a BMC user name is required")
	}
	if req.GetBmcPassword() == "" {
		return nil, apierr.Invalidf("a BMC password is required")
	}
	if req.GetBmcCipherSuite() > 17 {
		return nil, apierr.Invalidf("cipher suite %d: IPMI defines 0-17 (0 tries 17, then 3)", req.GetBmcCipherSuite())
	}
	insecure, pin := req.GetBmcInsecure(), ""
	if req.GetBmcTlsSha256() != "" {
		if pin, err = ParseTLSFingerprint(req.GetBmcTlsSha256()); err != nil {
			return nil, err
		}
	}
	if insecure && pin != "" {
		return nil, apierr.Invalidf("--bmc-insecure and --bmc-tls-sha256 exclude each other: pin a certificate or opt out of checking it")
	}
	if bproto == inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI && (insecure || pin != "") {
		return nil, apierr.Invalidf("--bmc-insecure and --bmc-tls-sha256 are for Redfish BMCs (TLS); IPMI has no certificate")
	}
	var bootMAC string
	if req.GetBootMac() != "" {
		if bootMAC, err = inventory.NormalizeMAC(req.GetBootMac()); err != nil {
			return nil, err
		}
	}
	existing, err := c.inv.GetMachine(ctx, name)
	if err != nil && !errors.Is(err, apierr.ErrNotFound) {
		return nil, err
	}
	if bootMAC != "" {
		if existing != nil && !hasMAC(existing, bootMAC) {
			return nil, apierr.Invalidf("machine %q exists without MAC %s: MACs cannot be changed by enroll", name, bootMAC)
		}
		if owner, err := c.inv.MachineByMAC(ctx, bootMAC); err == nil && owner.GetName() != name {
			return nil, apierr.Existsf("MAC %s belongs to machine %q: enroll that machine instead", bootMAC, owner.GetName())
		}
	}
	key := inventory.BMCAddressKey(host, port)
	// Refuse a duplicate before contacting anything.
	if err := c.checkAddressFree(ctx, key, name); err != nil {
		return nil, err
	}
	// Enrolling again at the same address (a new password, say) keeps
	// the pin: a new certificate must be given, not slipped in.
	pinGiven, pinKept := pin != "", false
	if old := existing.GetBmc(); pin == "" && !insecure && old.GetTlsSha256() != "" &&
		old.GetAddress() != "" && inventory.BMCAddressKey(old.GetAddress(), old.GetPort()) == key {
		pin, pinKept = old.GetTlsSha256(), true
	}
	t := Target{Host: host, Port: port, Protocol: bproto, Username: req.GetBmcUsername(), Password: req.GetBmcPassword(),
		CipherSuite: req.GetBmcCipherSuite(), Timeout: c.timeout(req.GetTimeoutMs()),
		TLSSHA256: pin, TLSInsecure: insecure, TLSFirstUse: pin == "" && !insecure}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	st, res, err := c.cfg.Driver.PowerState(cctx, t)
	cancel()
	if err == nil {
		err = checkEnrolledCertificate(t, res)
	}
	if err != nil {
		var ce *CertificateError
		if errors.As(err, &ce) && pinGiven {
			err = fmt.Errorf("BMC %s presents certificate sha256 %s, not the %s given with --bmc-tls-sha256: %w", t, ce.Presented, pin, ErrCertificate)
		}
		c.log.Info("BMC enrolment refused", "machine", name, "bmc", t.String(), "err", err)
		return nil, fmt.Errorf("enroll %s: %w", name, err)
	}
	tlsPin := ""
	if !insecure {
		tlsPin = res.TLSSHA256
	}
	sealed, err := c.cfg.Sealer.Seal([]byte(req.GetBmcPassword()), []byte(name))
	if err != nil {
		return nil, fmt.Errorf("seal BMC password: %w", err)
	}
	now := timestamppb.New(c.cfg.Now())
	bmc := &inventoryv1.Bmc{Address: host, Port: port, Protocol: bproto, Username: req.GetBmcUsername(),
		CipherSuite: req.GetBmcCipherSuite(), Provider: res.Provider, VerifiedAt: now, TlsSha256: tlsPin, TlsInsecure: insecure}
	// The address binding, the sealed password and the machine change in
	// one store transaction (docs/architecture.md, "Index records").
	bind := func(tx *record.Tx, _ *inventoryv1.Machine) error {
		var b inventoryv1.BmcAddressBinding
		exists, err := tx.Get(ctx, key, &b)
		if err != nil {
			return err
		}
		if exists {
			if err := c.ownerConflict(ctx, key, &b, name); err != nil {
				return err
			}
		}
		if err := tx.Put(key, &inventoryv1.BmcAddressBinding{MachineName: name, ClaimedAt: now}); err != nil {
			return err
		}
		var sec inventoryv1.BmcSecret
		if _, err := tx.Get(ctx, bmcSecretPrefix+name, &sec); err != nil {
			return err
		}
		return tx.Put(bmcSecretPrefix+name, &inventoryv1.BmcSecret{SealedPassword: sealed})
	}
	var m *inventoryv1.Machine
	if existing == nil {
		m, err = c.inv.CreateMachineWith(ctx, &inventoryv1.Machine{Name: name, BootMac: bootMAC, Bmc: bmc, PowerState: st, PowerReadAt: now}, bind)
		if errors.Is(err, apierr.ErrAlreadyExists) && !strings.Contains(err.Error(), "BMC ") {
			// Created concurrently (by DHCP or another enroll): attach.
			existing = &inventoryv1.Machine{}
		}
	}
	if existing != nil {
		var oldKey string
		m, err = c.inv.UpdateMachineWith(ctx, name, func(m *inventoryv1.Machine) error {
			oldKey = ""
			if old := m.GetBmc(); old.GetAddress() != "" && old.GetUsername() != "" {
				if k := inventory.BMCAddressKey(old.GetAddress(), old.GetPort()); k != key {
					oldKey = k
				}
			}
			bmc.InbandAddress = m.GetBmc().GetInbandAddress()
			flags := withoutFlag(inventory.BMCMismatchFlags(m.GetFlags(), bmc), FlagCertificateChanged)
			// Enrolling again at the same address keeps the console's
			// host key pin (and a refusal of it); another address pins
			// afresh.
			if old := m.GetBmc(); old.GetAddress() != "" && inventory.BMCAddressKey(old.GetAddress(), old.GetPort()) == key {
				bmc.ConsoleHostKey = old.GetConsoleHostKey()
			} else {
				flags = withoutFlag(flags, FlagConsoleHostKeyChanged)
			}
			m.Bmc = proto.CloneOf(bmc)
			m.PowerState, m.PowerReadAt = st, now
			m.Flags = flags
			return nil
		}, func(tx *record.Tx, m *inventoryv1.Machine) error {
			if err := bind(tx, m); err != nil {
				return err
			}
			// The binding of the address it was enrolled at before goes.
			if oldKey == "" {
				return nil
			}
			var b inventoryv1.BmcAddressBinding
			exists, err := tx.Get(ctx, oldKey, &b)
			if err != nil || !exists || b.GetMachineName() != name {
				return err
			}
			return tx.Delete(oldKey)
		})
	}
	if err != nil {
		return nil, err
	}
	tlsNote := tlsDescription(bmc, pinGiven, pinKept)
	detail := fmt.Sprintf("BMC %s (%s) enrolled; power %s", t, protoName(bproto), powerName(st))
	if tlsNote != "" {
		detail += "; " + tlsNote
	}
	c.event(m, "enrolled", detail, res)
	c.log.Info("BMC enrolled", "machine", name, "bmc", t.String(), "provider", res.Provider, "state", powerName(st), "tls", tlsNote)
	return m, nil
}

// checkEnrolledCertificate double-checks what an enrolment's BMC call
// says about the certificate: a Redfish BMC must have presented one (to
// pin), and the one given or kept (which the BMC adapter already
// enforced; under protocol auto an IPMI answer does not, so it is checked
// here).
func checkEnrolledCertificate(t Target, res Result) error {
	switch {
	case t.TLSInsecure:
		return nil
	case t.TLSSHA256 != "" && res.TLSSHA256 == "":
		return apierr.Preconditionf("BMC %s answered without TLS (%s), so the certificate given with --bmc-tls-sha256 cannot be checked: enroll it with --bmc-protocol ipmi and no pin", t, cmp.Or(res.Provider, "no provider"))
	case t.TLSSHA256 != "" && res.TLSSHA256 != t.TLSSHA256:
		return &CertificateError{Pinned: t.TLSSHA256, Presented: res.TLSSHA256}
	case t.Protocol == inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH && res.TLSSHA256 == "":
		return apierr.Unavailablef("BMC %s answered but presented no certificate to pin", t)
	}
	return nil
}

// tlsDescription says how the BMC's certificate is checked, for the
// timeline and the log ("" for a BMC with no TLS).
func tlsDescription(b *inventoryv1.Bmc, given, kept bool) string {
	switch {
	case b.GetTlsInsecure():
		return "certificate not verified (--bmc-insecure)"
	case b.GetTlsSha256() == "":
		return ""
	case given:
		return "certificate sha256 " + b.GetTlsSha256() + " pinned as given"
	case kept:
		return "certificate sha256 " + b.GetTlsSha256() + " still pinned"
	}
	return "certificate sha256 " + b.GetTlsSha256() + " pinned (trust on first use)"
}

// withoutFlag drops the flags that start with prefix.
func withoutFlag(flags []string, prefix string) []string {
	return slices.DeleteFunc(slices.Clone(flags), func(f string) bool { return strings.HasPrefix(f, prefix) })
}

// flagWith returns the flag that starts with prefix ("" when none).
func flagWith(flags []string, prefix string) string {
	for _, f := range flags {
		if strings.HasPrefix(f, prefix) {
			return f
		}
	}
	return ""
}

func protoName(p inventoryv1.BmcProtocol) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "BMC_PROTOCOL_"))
}

func powerName(s inventoryv1.PowerState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "POWER_STATE_"))
}

// checkAddressFree fails when key is bound to another live machine that
// still has that BMC.
func (c *Service) checkAddressFree(ctx context.Context, key, name string) error {
	var b inventoryv1.BmcAddressBinding
	if _, err := record.Get(ctx, c.cfg.Store, key, &b); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}
	return c.ownerConflict(ctx, key, &b, name)
}

func (c *Service) ownerConflict(ctx context.Context, key string, b *inventoryv1.BmcAddressBinding, name string) error {
	owner := b.GetMachineName()
	if owner == "" || owner == name {
		return nil
	}
	m, err := c.inv.GetMachine(ctx, owner)
	if err != nil && !errors.Is(err, apierr.ErrNotFound) {
		return err
	}
	if b := m.GetBmc(); b.GetAddress() != "" && inventory.BMCAddressKey(b.GetAddress(), b.GetPort()) == key {
		return apierr.Existsf("BMC %s is already enrolled on machine %q", keyAddr(key), owner)
	}
	// A binding its machine does not agree with is stale: the binding
	// and the machine are written in one transaction.
	return nil
}

func (c *Service) releaseAddress(ctx context.Context, key, name string) {
	ctx = context.WithoutCancel(ctx)
	_, err := record.Update(ctx, c.cfg.Store, key, func() *inventoryv1.BmcAddressBinding { return &inventoryv1.BmcAddressBinding{} },
		func(b *inventoryv1.BmcAddressBinding, exists bool) (bool, error) {
			if !exists || b.GetMachineName() != name {
				return false, errSkip
			}
			return true, nil
		})
	if err != nil && !errors.Is(err, errSkip) {
		c.log.Warn("could not release BMC address binding", "machine", name, "key", key, "err", err)
	}
}

// target loads a machine's BMC target with its opened password and its
// certificate pin. A Redfish BMC with neither a pin nor the insecure
// opt-out (enrolled before pinning) is refused before anything is
// opened or sent.
func (c *Service) target(ctx context.Context, name string) (*inventoryv1.Machine, Target, error) {
	m, err := c.inv.GetMachine(ctx, name)
	if err != nil {
		return nil, Target{}, err
	}
	b := m.GetBmc()
	if b.GetAddress() == "" || b.GetUsername() == "" {
		return m, Target{}, apierr.Preconditionf("machine %q has no enrolled BMC: run `corral machine enroll %s --bmc ...`", name, name)
	}
	redfish := b.GetProtocol() == inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH ||
		(b.GetProtocol() == inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO && b.GetProvider() == RedfishProviderName)
	if redfish && b.GetTlsSha256() == "" && !b.GetTlsInsecure() {
		return m, Target{}, fmt.Errorf("machine %s: %w", name, &CertificateError{})
	}
	var s inventoryv1.BmcSecret
	if _, err := record.Get(ctx, c.cfg.Store, bmcSecretPrefix+name, &s); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return m, Target{}, apierr.Preconditionf("machine %q has no stored BMC password: enroll it again", name)
		}
		return m, Target{}, err
	}
	pw, err := c.cfg.Sealer.Open(s.GetSealedPassword(), []byte(name))
	if err != nil {
		return m, Target{}, apierr.Preconditionf("machine %q: the stored BMC password cannot be opened (was the seal key replaced?): enroll it again", name)
	}
	port := b.GetPort()
	if port == 0 {
		port = defaultBMCPort(b.GetProtocol())
	}
	return m, Target{Host: b.GetAddress(), Port: port, Protocol: b.GetProtocol(), Username: b.GetUsername(), Password: string(pw),
		CipherSuite: b.GetCipherSuite(), Timeout: c.cfg.CallTimeout, TLSSHA256: b.GetTlsSha256(), TLSInsecure: b.GetTlsInsecure()}, nil
}

// noteCertificate keeps FlagCertificateChanged in step with the
// certificate a pinned Redfish BMC presented in a call: set when it
// differs from the pin (with a timeline entry and a warning, once per
// change, not once per poll), cleared when the pinned one is back. It
// writes only on a change.
func (c *Service) noteCertificate(ctx context.Context, m *inventoryv1.Machine, res Result) {
	pin := m.GetBmc().GetTlsSha256()
	if pin == "" || res.TLSSHA256 == "" {
		return
	}
	flag := ""
	if res.TLSSHA256 != pin {
		flag = fmt.Sprintf("%s: pinned sha256 %s, presented %s", FlagCertificateChanged, pin, res.TLSSHA256)
	}
	if flagWith(m.GetFlags(), FlagCertificateChanged) == flag {
		return
	}
	ctx = context.WithoutCancel(ctx)
	nm, err := c.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		if m.GetBmc().GetTlsSha256() != pin || flagWith(m.GetFlags(), FlagCertificateChanged) == flag {
			return errSkip // enrolled again meanwhile, or already noted
		}
		m.Flags = withoutFlag(m.GetFlags(), FlagCertificateChanged)
		if flag != "" {
			m.Flags = append(m.Flags, flag)
		}
		return nil
	})
	switch {
	case errors.Is(err, errSkip):
	case err != nil:
		c.log.Warn("could not record the BMC certificate flag", "machine", m.GetName(), "err", err)
	case flag != "":
		ce := &CertificateError{Pinned: pin, Presented: res.TLSSHA256}
		c.event(nm, FlagCertificateChanged, ce.Error(), res)
		c.log.Warn("BMC certificate changed", "machine", m.GetName(), "bmc", m.GetBmc().GetAddress(), "pinned", pin, "presented", res.TLSSHA256)
	default:
		c.event(nm, "bmc-certificate-restored", "BMC presents the pinned certificate sha256 "+pin+" again", res)
		c.log.Info("BMC certificate restored", "machine", m.GetName(), "bmc", m.GetBmc().GetAddress(), "pinned", pin)
	}
}

// event records a BMC event in the machine's boot timeline (keyed by MAC:
// machines with no known MAC only get a log line).
func (c *Service) event(m *inventoryv1.Machine, event, detail string, res Result) {
	mac := m.GetBootMac()
	if mac == "" && len(m.GetMacs()) > 0 {
		mac = m.GetMacs()[0]
	}
	attrs := map[string]string{}
	if res.Provider != "" {
		attrs["provider"] = res.Provider
	}
	if res.Note != "" {
		attrs["note"] = res.Note
	}
	if mac == "" {
		c.log.Info("bmc "+event, "machine", m.GetName(), "detail", detail)
		return
	}
	c.cfg.Events.Event(mac, "bmc", event, detail, attrs)
}

// Forget removes what enrolment stored beside a deleted machine record:
// its sealed BMC password and its BMC address binding (m is the record as
// it was). It is idempotent; failures are logged. Wire it to
// inventory.Config.OnDelete: until it runs, a deleted machine's sealed
// blob stays in the store (its binding is already ignored).
func (c *Service) Forget(ctx context.Context, m *inventoryv1.Machine) {
	name, b := m.GetName(), m.GetBmc()
	_, err := record.Update(ctx, c.cfg.Store, bmcSecretPrefix+name, func() *inventoryv1.BmcSecret { return &inventoryv1.BmcSecret{} },
		func(_ *inventoryv1.BmcSecret, exists bool) (bool, error) {
			if !exists {
				return false, errSkip
			}
			return true, nil
		})
	if err != nil && !errors.Is(err, errSkip) {
		c.log.Warn("could not remove sealed BMC password", "machine", name, "err", err)
	}
	if b.GetAddress() != "" {
		port := b.GetPort()
		if port == 0 {
			port = defaultBMCPort(b.GetProtocol())
		}
		c.releaseAddress(ctx, inventory.BMCAddressKey(b.GetAddress(), port), name)
	}
}

var errSkip = errors.New("skip")

func hasMAC(m *inventoryv1.Machine, mac string) bool {
	return m.GetBootMac() == mac || slices.Contains(m.GetMacs(), mac)
}

// keyAddr is the host:port of a BMC address index key.
func keyAddr(key string) string { return key[strings.LastIndex(key, "/")+1:] }
