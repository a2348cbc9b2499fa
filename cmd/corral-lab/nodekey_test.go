package main

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// checkNodeKeys proves, for every READY node of the rack, that its key
// was made on its machine:
//   - the install plan the discovery agent received carried no key
//     material (the agent prints the fields the plan arrived with);
//   - the timeline shows the agent's "certificate" step and the
//     appliance's "certificate-signed" entry for one key fingerprint;
//   - the node serves a certificate for exactly that key, issued to its
//     name by the appliance CA;
//   - no private key anywhere in the appliance's data directory or log is
//     that key (the appliance never had it).
func checkNodeKeys(t *testing.T, r *rack) {
	st := r.st
	caPool := x509.NewCertPool()
	caFile := filepath.Join(st.DataDir, "pki", "ca.crt") // appliance.PKIDir, pki.CACertFile
	caPEM, err := os.ReadFile(caFile)
	if err != nil || !caPool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("appliance CA %s: %v", caFile, err)
	}
	applianceKeys := privateKeyFingerprints(t, st.DataDir, filepath.Join(st.RunDir, "corrald.log"))
	if len(applianceKeys) == 0 {
		t.Fatalf("no private key found in %s: the scan is broken (the CA key is there)", st.DataDir)
	}
	t.Logf("%d private keys in the appliance's data directory and log", len(applianceKeys))
	nodes := r.nodeEndpoints()
	ms := r.machines()
	for _, lm := range st.Machines {
		m := ms[lm.Name]
		ep, ok := nodes[m.NodeName]
		if !ok {
			t.Errorf("%s: no node %q", lm.Name, m.NodeName)
			continue
		}
		console, _ := os.ReadFile(lm.Console())
		// "corral: appliance sent install plan ID: node N, disk D, wipe W (fields: ...)"
		plans := planLine.FindAllSubmatch(console, -1)
		if len(plans) == 0 {
			t.Errorf("%s: no install plan line on the console", lm.Name)
		}
		for _, p := range plans {
			fields := string(p[1])
			if strings.Contains(fields, "key") || strings.Contains(fields, "node_cert") || strings.Contains(fields, "unknown") {
				t.Errorf("%s: the install plan arrived with %q: key material or unknown fields", lm.Name, fields)
			}
		}

		var es []struct {
			At         time.Time         `json:"at"`
			Source     string            `json:"source"`
			Event      string            `json:"event"`
			Detail     string            `json:"detail"`
			Attributes map[string]string `json:"attributes"`
		}
		if err := json.Unmarshal(r.mustCorral("machine", "timeline", m.Name, "--limit", "5000", "-o", "json"), &es); err != nil {
			t.Fatal(err)
		}
		var signed, agentStep string
		var formatted, certified time.Time // the agent's format and certificate steps
		for _, e := range es {
			switch {
			case e.Source == "lifecycle" && e.Event == "certificate-signed":
				signed = e.Attributes["key"]
			case e.Source == "agent" && e.Event == "progress: format":
				formatted = e.At
			case e.Source == "agent" && e.Event == "progress: certificate" && strings.Contains(e.Detail, "made on this machine"):
				agentStep, certified = e.Detail, e.At
			case e.Event == "csr-refused":
				t.Errorf("%s: a certificate request was refused: %s", lm.Name, e.Detail)
			}
		}
		if signed == "" || !strings.Contains(agentStep, signed) {
			t.Errorf("%s: timeline: appliance signed key %q; the agent's certificate step says %q", lm.Name, signed, agentStep)
			continue
		}
		cert, err := servedCertificate(st.Namespace, ep)
		if err != nil {
			t.Errorf("%s: node %s at %s: %v", lm.Name, m.NodeName, ep, err)
			continue
		}
		fp := spkiFingerprint(cert.RawSubjectPublicKeyInfo)
		if _, err := cert.Verify(x509.VerifyOptions{Roots: caPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("%s: the node's certificate does not chain to the appliance CA: %v", lm.Name, err)
		}
		if cert.Subject.CommonName != m.NodeName || fp != signed {
			t.Errorf("%s: node serves a certificate for %q with key %s; the appliance signed %s for %q", lm.Name, cert.Subject.CommonName, fp, signed, m.NodeName)
		}
		if where, ok := applianceKeys[fp]; ok {
			t.Errorf("%s: the node's private key (%s) is on the appliance: %s", lm.Name, fp, where)
		}
		t.Logf("%s: node %s serves key %s, made on the machine (agent: %q); format step to certificate step (key, request, signing, check): %s",
			lm.Name, m.NodeName, fp, agentStep, certified.Sub(formatted).Round(time.Millisecond))
	}
}

// planLine matches the discovery agent's console line for a plan.
var planLine = regexp.MustCompile(`corral: appliance sent install plan \S+: node \S+, disk \S+, wipe \w+ \(fields: ([^)\n]*)\)`)

// nodeEndpoints maps node names to their HypervisorService host:port.
func (r *rack) nodeEndpoints() map[string]string {
	r.t.Helper()
	var ns []struct {
		Name           string `json:"name"`
		Address        string `json:"address"`
		HypervisorPort uint32 `json:"hypervisor_port"`
	}
	if err := json.Unmarshal(r.mustCorral("get", "nodes", "-o", "json"), &ns); err != nil {
		r.t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range ns {
		port := n.HypervisorPort
		if port == 0 {
			port = 20181
		}
		out[n.Name] = net.JoinHostPort(n.Address, strconv.Itoa(int(port)))
	}
	return out
}

// servedCertificate connects to addr from inside network namespace ns
// and returns the certificate the server presents. The node asks for a
// client certificate this test does not have: only the server's matters.
func servedCertificate(ns, addr string) (*x509.Certificate, error) {
	type result struct {
		cert *x509.Certificate
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread enters ns and is never unlocked: it exits with this
		// goroutine instead of going back to the pool in another
		// namespace.
		runtime.LockOSThread()
		f, err := os.Open(filepath.Join("/var/run/netns", ns))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		var got *x509.Certificate
		tc := tls.Client(conn, &tls.Config{
			InsecureSkipVerify: true, // verified by the caller against the appliance CA
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) > 0 {
					got = cs.PeerCertificates[0]
				}
				return nil
			},
		})
		herr := tc.Handshake()
		if got == nil {
			ch <- result{err: fmt.Errorf("no server certificate: %v", herr)}
			return
		}
		ch <- result{cert: got}
	}()
	res := <-ch
	return res.cert, res.err
}

func spkiFingerprint(spki []byte) string {
	sum := sha256.Sum256(spki)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// privateKeyFingerprints finds every PEM private key in the files under
// roots (files over 512 MiB skipped) and returns the fingerprints of
// their public keys, each with the file it is in.
func privateKeyFingerprints(t *testing.T, roots ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !d.Type().IsRegular() {
				return err
			}
			if info, err := d.Info(); err != nil || info.Size() > 512<<20 {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i := bytes.Index(b, []byte("-----BEGIN ")); i >= 0; {
				block, _ := pem.Decode(b[i:])
				if block != nil && strings.HasSuffix(block.Type, "PRIVATE KEY") {
					if fp, ok := publicOf(block); ok {
						out[fp] = path
					} else {
						t.Logf("%s: a %s block that does not parse", path, block.Type)
					}
				}
				next := bytes.Index(b[i+1:], []byte("-----BEGIN "))
				if next < 0 {
					break
				}
				i += 1 + next
			}
			return nil
		})
		if err != nil {
			t.Fatalf("scan %s: %v", root, err)
		}
	}
	return out
}

// publicOf is the SPKI fingerprint of a PEM private key's public key.
func publicOf(block *pem.Block) (string, bool) {
	var key any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return "", false
	}
	pub, ok := key.(interface{ Public() crypto.PublicKey })
	if !ok {
		return "", false
	}
	der, err := x509.MarshalPKIXPublicKey(pub.Public())
	if err != nil {
		return "", false
	}
	return spkiFingerprint(der), true
}
