package ipmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/bmc-toolbox/bmclib/v2/providers"
	ipmiclient "github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/jacobweinstock/registrar"
)

// NativeProviderName is the name the native RMCP+ provider answers as.
const NativeProviderName = "native-ipmi"

var nativeFeatures = registrar.Features{
	providers.FeaturePowerState,
	providers.FeaturePowerSet,
	providers.FeatureBootDeviceSet,
}

// nativeProvider is a bmclib provider speaking IPMI v2.0 (RMCP+) with
// github.com/bougou/go-ipmi: no ipmitool binary, and every exchange is
// bounded by the call's context.
type nativeProvider struct {
	host     string
	port     int
	user     string
	pass     string
	ciphers  []types.CipherSuiteID
	exchange time.Duration // per-datagram timeout before a retry
	c        *ipmiclient.Client
}

func newNativeProvider(t Target) *nativeProvider {
	ciphers := []types.CipherSuiteID{types.CipherSuiteID17, types.CipherSuiteID3}
	if t.CipherSuite != 0 {
		ciphers = []types.CipherSuiteID{types.CipherSuiteID(t.CipherSuite)}
	}
	return &nativeProvider{host: t.Host, port: t.PortFor(ProtocolIPMI), user: t.Username, pass: t.Password, ciphers: ciphers, exchange: time.Second}
}

func (p *nativeProvider) Name() string { return NativeProviderName }

// Open establishes an RMCP+ session, trying the cipher suites in order.
func (p *nativeProvider) Open(ctx context.Context) error {
	c, err := ipmiclient.NewClient(p.host, p.port, p.user, p.pass)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	c.WithInterface(ipmiclient.InterfaceLanplus)
	c.WithCipherSuiteID(p.ciphers...)
	c.WithMaxPrivilegeLevel(types.PrivilegeLevelAdministrator)
	// Retries continue until the context's deadline; each datagram waits
	// at most p.exchange for its answer.
	retries := 4
	if d, ok := ctx.Deadline(); ok {
		retries = max(0, int(time.Until(d)/p.exchange))
	}
	c.WithTimeout(p.exchange).WithRetry(retries)
	if err := c.Connect(ctx); err != nil {
		// Release the socket without waiting for a Close Session answer.
		dead, cancel := context.WithCancel(context.Background())
		cancel()
		_ = c.Close(dead)
		return classifyNative(ctx, err)
	}
	p.c = c
	return nil
}

// Close ends the session (bounded to one second).
func (p *nativeProvider) Close(ctx context.Context) error {
	if p.c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	err := p.c.Close(ctx)
	p.c = nil
	return err
}

func (p *nativeProvider) PowerStateGet(ctx context.Context) (string, error) {
	if p.c == nil {
		return "", fmt.Errorf("%w: session not open", ErrFailed)
	}
	st, err := p.c.GetChassisStatus(ctx)
	if err != nil {
		return "", classifyNative(ctx, err)
	}
	if st.PowerIsOn {
		return "on", nil
	}
	return "off", nil
}

func (p *nativeProvider) PowerSet(ctx context.Context, state string) (bool, error) {
	if p.c == nil {
		return false, fmt.Errorf("%w: session not open", ErrFailed)
	}
	var ctl chassis.ChassisControl
	switch strings.ToLower(state) {
	case "on":
		ctl = chassis.ChassisControlPowerUp
	case "off":
		ctl = chassis.ChassisControlPowerDown
	case "soft":
		ctl = chassis.ChassisControlSoftShutdown
	case "cycle":
		ctl = chassis.ChassisControlPowerCycle
	case "reset":
		ctl = chassis.ChassisControlHardReset
	default:
		return false, fmt.Errorf("%w: power state %q", ErrInvalid, state)
	}
	if _, err := p.c.ChassisControl(ctx, ctl); err != nil {
		return false, classifyNative(ctx, err)
	}
	return true, nil
}

func (p *nativeProvider) BootDeviceSet(ctx context.Context, device string, persistent, efi bool) (bool, error) {
	if p.c == nil {
		return false, fmt.Errorf("%w: session not open", ErrFailed)
	}
	var sel types.BootDeviceSelector
	switch device {
	case "pxe":
		sel = types.BootDeviceSelectorForcePXE
	case "disk":
		sel = types.BootDeviceSelectorForceHardDrive
	case "bios":
		sel = types.BootDeviceSelectorForceBIOSSetup
	default:
		return false, fmt.Errorf("%w: boot device %q", ErrInvalid, device)
	}
	bt := types.BIOSBootTypeLegacy
	if efi {
		bt = types.BIOSBootTypeEFI
	}
	if err := p.c.SetBootDevice(ctx, sel, bt, persistent); err != nil {
		return false, classifyNative(ctx, err)
	}
	return true, nil
}

// DeviceInfo reads Get Device ID.
func (p *nativeProvider) DeviceInfo(ctx context.Context) (Info, error) {
	if p.c == nil {
		return Info{}, fmt.Errorf("%w: session not open", ErrFailed)
	}
	id, err := p.c.GetDeviceID(ctx)
	if err != nil {
		return Info{}, classifyNative(ctx, err)
	}
	return Info{
		Provider: NativeProviderName,
		Vendor:   fmt.Sprintf("IANA %d", uint32(id.ManufacturerID)),
		Model:    fmt.Sprintf("product 0x%04x", uint16(id.ProductID)),
		Firmware: fmt.Sprintf("%d.%02x", id.MajorFirmwareRevision, id.MinorFirmwareRevision),
	}, nil
}

// authFailureTexts are the messages go-ipmi uses for rejected credentials.
// go-ipmi v0.9.1 joins the per-cipher-suite errors of Connect with %v, so
// the typed errors (ErrRAKPAuthentication, *RmcpStatusError) do not survive
// errors.Is/As; their own texts are what is left to recognise them by.
var authFailureTexts = []string{
	ipmiclient.ErrRAKPAuthentication.Error(),
	types.RmcpStatusCodeUnauthorizedName.String(),
	types.RmcpStatusCodeInvalidIntegrityCheckValue.String(),
	types.RmcpStatusCodeUnauthorizedRoleOfPriLevel.String(),
	types.RmcpStatusCodeInvalidRole.String(),
}

// cipherMismatchTexts mean the BMC does not offer the cipher suite asked for.
var cipherMismatchTexts = []string{
	types.RmcpStatusCodeNoCipherSuiteMatch.String(),
	types.RmcpStatusCodeInvalidAuthAlg.String(),
	types.RmcpStatusCodeInvalidIntegrityAlg.String(),
	types.RmcpStatusCodeInvalidConfidentAlg.String(),
}

// classifyNative wraps a go-ipmi error with one of this package's
// sentinels (and the context's error when it ended the call).
func classifyNative(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w: no answer before the deadline", ErrUnreachable, ctx.Err())
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) < 100*time.Millisecond {
		// go-ipmi stops reading at the context's deadline, a hair before
		// the context itself reports it.
		return fmt.Errorf("%w: %w: no answer before the deadline", ErrUnreachable, context.DeadlineExceeded)
	}
	msg := err.Error()
	for _, s := range authFailureTexts {
		if strings.Contains(msg, s) {
			return fmt.Errorf("%w: the BMC rejected the user name or password (%s)", ErrAuth, s)
		}
	}
	if _, ok := types.IsResponseError(err); ok {
		return fmt.Errorf("%w: %v", ErrFailed, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "i/o timeout") {
		return fmt.Errorf("%w: no answer: %v", ErrUnreachable, err)
	}
	if strings.Contains(msg, "connection refused") || strings.Contains(msg, "no route to host") || strings.Contains(msg, "network is unreachable") || strings.Contains(msg, "no such host") {
		return fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	for _, s := range cipherMismatchTexts {
		if strings.Contains(msg, s) {
			return fmt.Errorf("%w: no common cipher suite (set the BMC's cipher suite explicitly): %v", ErrFailed, err)
		}
	}
	return fmt.Errorf("%w: %v", ErrProtocol, err)
}
