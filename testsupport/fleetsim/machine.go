package fleetsim

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/iana"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/corralhq/corral/agent/cmdline"
	agentsession "github.com/corralhq/corral/agent/session"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// machine is one simulated server: its identity, what it holds, and the
// times of its steps.
type machine struct {
	s       *sim
	id      machineID
	dhcp    dhcpClient
	fullGet bool // fetch kernel and initramfs whole
	node    bool // becomes a heartbeating hypervisor node once installed

	ip       netip.Addr
	powerOn  time.Time
	regAt    time.Time // first successful Register
	planAt   time.Time
	name     string
	kexec    bool // the agent offers kexec (as corral-node's does)
	rebootCh chan struct{}
	rebootMu sync.Once
	rebootAt time.Time
	kexecd   bool // the appliance had it kexec into the hypervisor image
	// dhcpServer is the appliance that ACKed its latest lease.
	dhcpServer netip.Addr

	// mu guards what the session's goroutines write: registration,
	// plan, and the node identity the install made.
	mu                     sync.Mutex
	certPEM, keyPEM, caPEM []byte
	nodeEndpoint           string // the install plan's appliance_endpoint
	registered             bool
}

// bootScript is what the iPXE script said.
type bootScript struct {
	intent          string
	kernel, initrd  string
	params          cmdline.Params
	hasKernelParams bool
}

// boot runs one network boot: firmware DHCP, iPXE DHCP, the script and
// the kernel and initramfs fetches. Each step is timed.
func (m *machine) boot(ctx context.Context) (bootScript, error) {
	s := m.s
	var bs bootScript
	deadline := time.Now().Add(s.cfg.DHCPGiveUp)
	t := time.Now()
	l, err := s.dhcp.dora(ctx, &m.dhcp, false, s.cfg.DHCPTimeoutScale, deadline)
	s.st.add("dhcp retries", int64(l.retries))
	if err != nil {
		return bs, failure("dhcp", err)
	}
	s.st.observe(PhaseDHCP, time.Since(t))
	if err := m.hold(l.ip); err != nil {
		return bs, err
	}
	m.dhcpServer, _ = netip.AddrFromSlice(l.server.To4())
	m.s.countDHCP(m.dhcpServer)
	switch {
	case l.bootFile == "":
		s.st.add("firmware answers without an iPXE binary", 1)
	case !s.cfg.NoTFTP && !strings.Contains(l.bootFile, "://"):
		// The firmware fetches iPXE over TFTP from next-server.
		next := l.next
		if !next.IsValid() || next.IsUnspecified() {
			next = m.dhcpServer
		}
		t = time.Now()
		n, err := s.topo.client.tftpGet(ctx, m.ip, next, l.bootFile, time.Duration(float64(2*time.Second)*s.cfg.DHCPTimeoutScale))
		s.st.add("bytes fetched", n)
		if err != nil {
			return bs, failure("tftp", err)
		}
		s.st.observe(PhaseTFTP, time.Since(t))
	}
	// iPXE's own DHCP: the script URL.
	t = time.Now()
	l2, err := s.dhcp.dora(ctx, &m.dhcp, true, s.cfg.DHCPTimeoutScale, deadline)
	s.st.add("dhcp retries", int64(l2.retries))
	if err != nil {
		return bs, failure("ipxe dhcp", err)
	}
	s.st.observe(PhaseIPXEDHCP, time.Since(t))
	if l2.ip != l.ip {
		s.st.add("ipxe got another address than the firmware", 1)
		if err := m.hold(l2.ip); err != nil {
			return bs, err
		}
	}
	if !strings.HasPrefix(l2.bootFile, "http://") {
		return bs, fmt.Errorf("ipxe dhcp: boot file %q is no script URL", l2.bootFile)
	}
	hc := &http.Client{Timeout: s.cfg.HTTPTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return s.topo.client.dial(ctx, m.ip, addr)
		},
		MaxIdleConnsPerHost: 1, DisableCompression: true,
	}}
	defer hc.CloseIdleConnections()
	t = time.Now()
	bs, err = m.script(ctx, hc, l2.bootFile)
	if err != nil {
		return bs, err
	}
	s.st.observe(PhaseScript, time.Since(t))
	if bs.kernel == "" {
		return bs, nil
	}
	t = time.Now()
	for _, u := range []struct {
		url  string
		size int64
	}{{bs.kernel, s.cfg.KernelBytes}, {bs.initrd, s.cfg.InitrdBytes}} {
		if err := m.fetch(ctx, hc, u.url, u.size); err != nil {
			return bs, err
		}
	}
	s.st.observe(PhaseFetch, time.Since(t))
	return bs, nil
}

// bootRetry boots until one attempt gets through or Config.BootGiveUp
// has passed: a failed TFTP, script or fetch makes the firmware (or iPXE)
// give up that boot, and the server tries PXE again after a few seconds,
// as real servers loop over their boot order. Each retry is counted
// under its cause.
func (m *machine) bootRetry(ctx context.Context) (bootScript, error) {
	deadline := time.Now().Add(m.s.cfg.BootGiveUp)
	for {
		bs, err := m.boot(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return bs, err
		}
		m.s.st.add("boot retried after: "+cause(err), 1)
		wait := time.Duration(float64(m.s.cfg.BootRetry) * (0.6 + 0.8*mrand.Float64()))
		if !sleepCtx(ctx, wait) {
			return bs, ctx.Err()
		}
	}
}

// hold puts the leased address on the client end and records it; a
// second MAC ACKed an address someone holds is a duplicate.
func (m *machine) hold(ip netip.Addr) error {
	s := m.s
	mac := m.dhcp.mac.String()
	s.leaseMu.Lock()
	if h, ok := s.holders[ip]; ok && h != mac {
		s.dups++
		if len(s.dupLines) < 10 {
			s.dupLines = append(s.dupLines, fmt.Sprintf("%s ACKed to %s while %s holds it", ip, mac, h))
		}
	}
	if m.ip.IsValid() && m.ip != ip && s.holders[m.ip] == mac {
		delete(s.holders, m.ip)
	}
	s.holders[ip] = mac
	s.leaseMu.Unlock()
	m.ip = ip
	if err := s.topo.addAddr(ip); err != nil {
		return failure("address", err)
	}
	return nil
}

// script fetches and parses the iPXE script.
func (m *machine) script(ctx context.Context, hc *http.Client, url string) (bootScript, error) {
	var bs bootScript
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return bs, err
	}
	req.Header.Set("User-Agent", "iPXE/1.21.1")
	resp, err := hc.Do(req)
	if err != nil {
		return bs, failure("script", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return bs, failure("script", err)
	}
	if resp.StatusCode != http.StatusOK {
		return bs, fmt.Errorf("script: HTTP %d", resp.StatusCode)
	}
	return parseScript(body)
}

// parseScript reads the iPXE script boot/http renders: the intent from
// its comment line, the kernel URL and command line, the initrd URL.
func parseScript(body []byte) (bootScript, error) {
	var bs bootScript
	sc := bufio.NewScanner(bytes.NewReader(body))
	first := true
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if first {
			if line != "#!ipxe" {
				return bs, errors.New("script: not an iPXE script")
			}
			first = false
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "#" && f[1] == "Corral":
			bs.intent = f[2]
		case len(f) >= 2 && f[0] == "kernel":
			bs.kernel = f[1]
			p, err := cmdline.Parse(strings.Join(f[2:], " "))
			if err != nil {
				return bs, fmt.Errorf("script: kernel command line: %w", err)
			}
			bs.params, bs.hasKernelParams = p, true
		case len(f) >= 2 && f[0] == "initrd":
			bs.initrd = f[len(f)-1]
		}
	}
	if bs.intent == "" {
		return bs, errors.New("script: no Corral intent line")
	}
	if bs.kernel != "" && bs.initrd == "" {
		return bs, errors.New("script: kernel without initrd")
	}
	return bs, nil
}

// fetch GETs an artifact: the first 64 KiB (checking 206 and the total
// Content-Range names), or all of it for the full-fetch share.
func (m *machine) fetch(ctx context.Context, hc *http.Client, url string, size int64) error {
	return m.fetchChecked(ctx, hc, url, size, "")
}

// fetchChecked is fetch that also checks a whole file's SHA-256 (hex)
// when sum is set.
func (m *machine) fetchChecked(ctx context.Context, hc *http.Client, url string, size int64, sum string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	const rangeBytes = 64 << 10
	want := size
	if !m.fullGet {
		req.Header.Set("Range", fmt.Sprintf("bytes=0-%d", rangeBytes-1))
		want = min(size, rangeBytes)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return failure("fetch", err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	m.s.st.add("bytes fetched", n)
	if err != nil {
		return failure("fetch", err)
	}
	switch {
	case m.fullGet && resp.StatusCode != http.StatusOK:
		return fmt.Errorf("fetch: HTTP %d", resp.StatusCode)
	case !m.fullGet && resp.StatusCode != http.StatusPartialContent:
		return fmt.Errorf("fetch ranged: HTTP %d", resp.StatusCode)
	case n != want:
		return fmt.Errorf("fetch: %d bytes, want %d", n, want)
	}
	if m.fullGet && sum != "" && hex.EncodeToString(h.Sum(nil)) != strings.ToLower(sum) {
		return errors.New("fetch: SHA-256 differs from the plan's")
	}
	if !m.fullGet {
		cr := resp.Header.Get("Content-Range")
		_, total, _ := strings.Cut(cr, "/")
		if tn, err := strconv.ParseInt(total, 10, 64); err != nil || tn != size {
			return fmt.Errorf("fetch ranged: Content-Range %q, want total %d", cr, size)
		}
	}
	return nil
}

// discover runs the real discovery agent's session client until the
// appliance reboots the machine after its install.
func (m *machine) discover(ctx context.Context, bs bootScript) error {
	s := m.s
	if !bs.hasKernelParams {
		return errors.New("discover: the script has no kernel command line")
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := agentsession.Config{
		Endpoints: bs.params.Endpoints, Token: bs.params.Token, CAFingerprint: bs.params.CAFingerprint,
		BootMAC: bs.params.MAC, AgentVersion: "corral-sim",
		Facts:     func(context.Context) *inventoryv1.Facts { return m.id.facts() },
		Power:     simPower{m},
		Installer: &simInstaller{m: m},
		Heartbeat: s.cfg.AgentHeartbeat, RPCTimeout: 60 * time.Second,
		Backoff: agentsession.Backoff{Initial: time.Second, Max: 15 * time.Second},
		DialOptions: []grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return s.topo.client.dial(ctx, m.ip, addr) }),
			grpc.WithUnaryInterceptor(m.registerTimer),
			grpc.WithStreamInterceptor(m.sessionTimer),
		},
	}
	if m.kexec {
		cfg.Kexec = &simKexec{m: m}
	}
	if bs.params.MAC != m.dhcp.mac.String() {
		return fmt.Errorf("discover: corral.mac %s is not the boot MAC %s", bs.params.MAC, m.dhcp.mac)
	}
	// ended is closed once Run has returned runErr; after a cancel below
	// only the ending matters, not what the cancelled session said.
	var runErr error
	ended := make(chan struct{})
	go func() { defer close(ended); runErr = agentsession.Run(sctx, cfg) }()
	timeout := time.NewTimer(s.cfg.InstallGiveUp)
	defer timeout.Stop()
	select {
	case <-m.rebootCh:
		cancel()
		<-ended
		return nil
	case <-ended:
		if runErr != nil {
			return fmt.Errorf("agent session: %w", runErr)
		}
		return ctx.Err()
	case <-timeout.C:
		cancel()
		<-ended
		m.mu.Lock()
		defer m.mu.Unlock()
		if !m.registered {
			return errors.New("never registered")
		}
		if m.planAt.IsZero() {
			return errors.New("registered, no install plan")
		}
		return errors.New("install: no reboot after done")
	}
}

func (m *machine) registerTimer(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	t := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if strings.HasSuffix(method, "/Register") {
		if err != nil {
			m.s.st.fail("register: " + status.Code(err).String())
			return err
		}
		m.s.st.observe(PhaseRegister, time.Since(t))
		m.mu.Lock()
		if r, ok := reply.(*nodev1.RegisterResponse); ok {
			m.name = r.GetMachineName()
		}
		if !m.registered {
			m.registered, m.regAt = true, time.Now()
			m.s.st.observe(PhasePowerToInv, m.regAt.Sub(m.powerOn))
			m.s.registered.Add(1)
			m.s.lastReg.Store(m.regAt.UnixNano())
		}
		m.mu.Unlock()
	}
	return err
}

func (m *machine) sessionTimer(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	t := time.Now()
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		m.s.st.fail("session: " + status.Code(err).String())
		return cs, err
	}
	return &firstSend{ClientStream: cs, t: t, st: m.s.st}, nil
}

// firstSend times a stream from its opening to its first message sent
// (the agent's first heartbeat).
type firstSend struct {
	grpc.ClientStream
	t    time.Time
	st   *stats
	once sync.Once
}

func (f *firstSend) SendMsg(msg any) error {
	err := f.ClientStream.SendMsg(msg)
	f.once.Do(func() {
		if err == nil {
			f.st.observe(PhaseSession, time.Since(f.t))
		}
	})
	return err
}

type simPower struct{ m *machine }

func (simPower) PowerOff() error { return errors.New("the simulator does not power off") }

// Reboot ends the discovery boot: the machine goroutine stops the
// session and boots again.
func (p simPower) Reboot() error {
	p.m.leave(false)
	return nil
}

// leave ends the discovery image: a reboot, or a kexec into the
// hypervisor image.
func (m *machine) leave(kexec bool) {
	m.rebootMu.Do(func() {
		m.mu.Lock()
		m.rebootAt, m.kexecd = time.Now(), kexec
		if !kexec && !m.planAt.IsZero() { // (Kexec observed it at the plan)
			m.s.st.observe(PhaseInstall, m.rebootAt.Sub(m.planAt))
		}
		m.mu.Unlock()
		close(m.rebootCh)
	})
}

// simKexec fetches the hypervisor kernel and initramfs the plan names
// (ranged or whole, as the machine's boot fetches; sizes and, whole, the
// SHA-256 checked) from the machine's address, then "kexecs": the
// machine becomes a node without a firmware reboot. Like the real one it
// does not return once it has booted the image.
type simKexec struct{ m *machine }

func (k *simKexec) Kexec(ctx context.Context, plan *nodev1.KexecPlan) error {
	m := k.m
	m.mu.Lock()
	planAt := m.planAt
	m.mu.Unlock()
	if !planAt.IsZero() {
		m.s.st.observe(PhaseInstall, time.Since(planAt))
	}
	hc := &http.Client{Timeout: m.s.cfg.HTTPTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return m.s.topo.client.dial(ctx, m.ip, addr)
		},
		MaxIdleConnsPerHost: 1, DisableCompression: true,
	}}
	defer hc.CloseIdleConnections()
	t := time.Now()
	for _, f := range []struct {
		url, sum string
		size     int64
	}{{plan.GetKernelUrl(), plan.GetKernelSha256(), plan.GetKernelSize()}, {plan.GetInitrdUrl(), plan.GetInitrdSha256(), plan.GetInitrdSize()}} {
		if err := m.fetchChecked(ctx, hc, f.url, f.size, f.sum); err != nil {
			m.s.st.fail(cause(fmt.Errorf("kexec %w", err)))
			return err
		}
	}
	m.s.st.observe(PhaseKexecFetch, time.Since(t))
	m.leave(true)
	<-ctx.Done()
	return nil
}

// simInstaller reports the real install steps with short pauses, makes a
// real node key and has its CSR signed.
type simInstaller struct{ m *machine }

func (in *simInstaller) Install(ctx context.Context, plan *nodev1.InstallPlan, sign func(context.Context, []byte) ([]byte, error), progress func(*nodev1.Progress)) error {
	m := in.m
	m.mu.Lock()
	if m.planAt.IsZero() {
		m.planAt = time.Now()
		m.s.st.observe(PhaseAccept, m.planAt.Sub(m.regAt))
	}
	m.mu.Unlock()
	id := plan.GetInstallId()
	step := func(name, detail string) error {
		progress(&nodev1.Progress{Step: name, Detail: detail, InstallId: id})
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(m.s.cfg.InstallStep):
			return nil
		}
	}
	for _, st := range []struct{ name, detail string }{
		{"disk", "chose /dev/nvme0n1"}, {"partition", "GPT: ESP + data"}, {"format", "ext4 on data"},
	} {
		if err := step(st.name, st.detail); err != nil {
			return err
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: plan.GetHostname()}}, key)
	if err != nil {
		return err
	}
	progress(&nodev1.Progress{Step: "certificate", Detail: "certificate request sent", InstallId: id})
	cert, err := sign(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	if err != nil {
		progress(&nodev1.Progress{Step: "certificate", Done: true, Error: err.Error(), InstallId: id})
		return err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.certPEM, m.keyPEM, m.caPEM = cert, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), []byte(plan.GetCaCertPem())
	m.nodeEndpoint = plan.GetApplianceEndpoint()
	m.mu.Unlock()
	if err := step("identity", "node identity written"); err != nil {
		return err
	}
	progress(&nodev1.Progress{Step: "done", Done: true, Detail: "installed", InstallId: id})
	return nil
}

func (in *simInstaller) Wipe(context.Context, *nodev1.WipePlan, func(*nodev1.Progress)) error {
	return errors.New("the simulator does not wipe")
}

// nodeCreds is a node's mTLS configuration from its certificate.
func nodeCreds(certPEM, keyPEM, caPEM []byte) (credentials.TransportCredentials, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("node: no CA certificate")
	}
	return credentials.NewTLS(&tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
		VerifyConnection: clientconfig.VerifyApplianceConnection,
	}), nil
}

// heartbeat applies the node every interval, like hypervisor/node does,
// until ctx ends. first is called after the first success.
func (s *sim) heartbeat(ctx context.Context, conn *grpc.ClientConn, req *poolv1.ApplyNodeRequest, first func()) {
	c := poolv1.NewNodeServiceClient(conn)
	t := time.NewTicker(s.cfg.NodeHeartbeat)
	defer t.Stop()
	ok := false
	for {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, s.cfg.NodeHeartbeat)
		_, err := c.ApplyNode(rctx, req)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.st.fail("apply node: " + status.Code(err).String())
		default:
			s.st.observe(PhaseHeartbeat, time.Since(start))
			if !ok {
				ok = true
				first()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func archOf(uefi bool) iana.Arch {
	if uefi {
		return iana.EFI_X86_64
	}
	return iana.INTEL_X86PC
}

// failure wraps err under a short cause for the failure table.
func failure(step string, err error) error {
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.As(err, &ue) && !ue.Timeout():
		// Without the URL: it names the MAC.
		return fmt.Errorf("%s: %s: %s", step, ue.Op, cause(ue.Err))
	case errors.Is(err, errDHCPTimeout):
		return fmt.Errorf("%s: timeout", step)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: run ended", step)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%s: timeout", step)
	}
	return fmt.Errorf("%s: %w", step, err)
}
