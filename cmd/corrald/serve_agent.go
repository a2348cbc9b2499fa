package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/corralhq/corral/appliance"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/lifecycle"
)

// addAgentFlags registers the flags that bound what a machine on the boot
// LAN can do before anyone trusts it: boot script rate limits, the agent
// edge (sessions, progress) and the auto-accept guard.
func addAgentFlags(groups *flagGroups, sf *serveFlags) {
	b, f := groups.set(groupBoot), groups.set(groupMachines)
	d := boothttp.DefaultScriptLimits()
	s, a := &sf.cfg.Boot.Scripts, &sf.cfg.Lifecycle.Agents
	b.IntVar(&s.MACBurst, "boot-script-mac-burst", d.MACBurst, "boot scripts one MAC may fetch at once before --boot-script-mac-interval applies; 0 = default (env CORRAL_BOOT_SCRIPT_MAC_BURST)")
	b.DurationVar(&s.MACInterval, "boot-script-mac-interval", d.MACInterval, "one more boot script per MAC every this long once its burst is spent; 0 = default (env CORRAL_BOOT_SCRIPT_MAC_INTERVAL)")
	b.IntVar(&s.AddrBurst, "boot-script-addr-burst", d.AddrBurst, "boot scripts one source address may fetch at once (any MACs) before --boot-script-addr-interval applies; 0 = default (env CORRAL_BOOT_SCRIPT_ADDR_BURST)")
	b.DurationVar(&s.AddrInterval, "boot-script-addr-interval", d.AddrInterval, "one more boot script per source address every this long once its burst is spent; 0 = default (env CORRAL_BOOT_SCRIPT_ADDR_INTERVAL)")
	b.IntVar(&s.MaxTracked, "boot-script-max-tracked", d.MaxTracked, "MACs and source addresses whose boot script budgets are remembered (each); a full table forgets the least recently used; 0 = default (env CORRAL_BOOT_SCRIPT_MAX_TRACKED)")
	f.StringSliceVar(&sf.autoAcceptSerials, "auto-accept-serials", nil, "with --auto-accept: accept only machines whose serial is listed, comma-separated or repeated (env CORRAL_AUTO_ACCEPT_SERIALS)")
	f.StringVar(&sf.autoAcceptSerialsFile, "auto-accept-serials-file", "", "with --auto-accept: accept only machines whose serial is in this file, one per line, # comments (env CORRAL_AUTO_ACCEPT_SERIALS_FILE)")
	f.StringSliceVar(&sf.cfg.Lifecycle.TPMEKCAs, "tpm-ek-ca", nil, "PEM files of TPM manufacturers' CAs, comma-separated or repeated: a machine's TPM proof then counts only with an endorsement key certificate that chains to one of them; none: credential activation alone proves the key (env CORRAL_TPM_EK_CA)")
	f.DurationVar(&a.HeartbeatTimeout, "agent-heartbeat-timeout", lifecycle.DefaultAgentHeartbeatTimeout, "a discovery agent's session counts as alive this long after its last heartbeat: a second session of the machine is refused meanwhile; 0 = default (env CORRAL_AGENT_HEARTBEAT_TIMEOUT)")
	f.DurationVar(&a.SessionIDTTL, "agent-session-id-ttl", lifecycle.DefaultSessionIDTTL, "a session id from Register expires unused after this; 0 = default (env CORRAL_AGENT_SESSION_ID_TTL)")
	f.IntVar(&a.MaxPendingSessions, "agent-max-pending-sessions", lifecycle.DefaultMaxPendingSessions, "session ids waiting for their session, at most (the oldest is evicted beyond); 0 = default (env CORRAL_AGENT_MAX_PENDING_SESSIONS)")
	f.IntVar(&a.MaxProgressBytes, "agent-max-progress-bytes", lifecycle.DefaultMaxProgressBytes, "an agent's progress step, detail and error are each truncated to this many bytes; 0 = default (env CORRAL_AGENT_MAX_PROGRESS_BYTES)")
}

// agentConfig checks the settings of addAgentFlags and completes c with
// the auto-accept allowlist (which reads --auto-accept-serials-file).
func (sf *serveFlags) agentConfig(c *appliance.Config) error {
	if err := c.Boot.Scripts.Validate(); err != nil {
		return err
	}
	if ttl := c.Boot.TokenTTL; ttl < 0 || (ttl > 0 && ttl < time.Second) {
		return fmt.Errorf("--boot-token-ttl %s: at least 1s (0 = the default, 1h)", ttl)
	}
	if err := c.Lifecycle.Agents.Validate(); err != nil {
		return err
	}
	serials, err := autoAcceptSerials(sf.autoAcceptSerials, sf.autoAcceptSerialsFile)
	if err != nil {
		return err
	}
	c.Lifecycle.AutoAcceptSerials = serials
	return nil
}

// autoAcceptSerials merges the allowlist given inline and in a file. A
// file that cannot be read, or names no serial, is an error: an allowlist
// that silently allowed nothing (or everything) would hide the mistake.
func autoAcceptSerials(list []string, file string) ([]string, error) {
	var out []string
	for _, s := range list {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	if file == "" {
		return out, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--auto-accept-serials-file: %w", err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
			n++
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("--auto-accept-serials-file %s names no serial", file)
	}
	return out, nil
}
