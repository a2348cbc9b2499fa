package lifecycle

import (
	"context"
	"fmt"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TPMVerifier makes and checks the credential-activation challenges that
// prove a machine holds its TPM's endorsement key (auth/tpmid.Verifier).
// bind names who may answer a challenge: the caller and the boot MAC.
type TPMVerifier interface {
	// Begin checks the EK and AK the agent offers and returns a challenge
	// for bind.
	Begin(bind string, req *nodev1.AttestBeginRequest) (*nodev1.AttestBeginResponse, error)
	// Finish uses up the challenge proof names and returns the proved
	// EK's identity, or why the proof fails.
	Finish(bind string, proof *nodev1.TpmProof) (ek string, err error)
}

// attestBind is what a challenge is bound to: the caller's token (or
// certificate name) and the boot MAC.
func attestBind(c Caller, bootMAC string) string { return c.key() + " " + bootMAC }

// AttestBegin answers a discovery agent's request for a TPM challenge:
// same callers as Register (a per-boot token only for its own boot MAC).
// Unimplemented when the appliance has no TPMVerifier.
func (s *AgentServer) AttestBegin(ctx context.Context, req *nodev1.AttestBeginRequest) (*nodev1.AttestBeginResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	if c.Role == CallerNode {
		return nil, status.Error(codes.PermissionDenied, "AttestBegin is for discovery agents, not node certificates")
	}
	if s.TPM == nil {
		return s.UnimplementedAgentServiceServer.AttestBegin(ctx, req)
	}
	boot, err := inventory.NormalizeMAC(req.GetBootMac())
	if err != nil {
		return nil, toStatus(fmt.Errorf("boot_mac: %w", err))
	}
	if c.MAC != "" && boot != c.MAC {
		return nil, toStatus(s.Lifecycle.refuseRegister(c, peerAddr(ctx), boot, "", fmt.Sprintf("TPM challenge: the token was issued for boot MAC %s, not %s", c.MAC, boot)))
	}
	resp, err := s.TPM.Begin(attestBind(c, boot), req)
	if err != nil {
		s.Lifecycle.warn("TPM challenge refused", "mac", boot, "token_id", c.ID, "peer", peerAddr(ctx), "err", err)
		return nil, toStatus(err)
	}
	return resp, nil
}

// proveTPM checks a Register's TPM proof and returns the verified EK
// identity: "" when the report carries no proof (a machine without a
// TPM). A proof that fails refuses the Register (recorded on the boot
// MAC's timeline); an unknown, used or expired challenge is
// FailedPrecondition, so the agent asks for a new one.
func (s *AgentServer) proveTPM(ctx context.Context, c Caller, req *nodev1.RegisterRequest) (string, error) {
	proof := req.GetTpm()
	if proof == nil {
		return "", nil
	}
	if s.TPM == nil {
		return "", apierr.Preconditionf("this appliance checks no TPM proofs (no challenge was issued)")
	}
	boot, err := inventory.NormalizeMAC(req.GetBootMac())
	if err != nil {
		return "", fmt.Errorf("boot_mac: %w", err)
	}
	ek, err := s.TPM.Finish(attestBind(c, boot), proof)
	if err != nil {
		l := s.Lifecycle
		attrs := map[string]string{"token_id": c.ID, "peer": peerAddr(ctx), "boot_mac": boot}
		l.note(boot, "register-refused", "Register refused: TPM proof: "+err.Error(), attrs)
		l.warn("agent Register refused", "token_id", c.ID, "mac", boot, "peer", peerAddr(ctx), "reason", "TPM proof", "err", err)
		return "", err
	}
	s.Lifecycle.ev.Event(boot, "agent", "tpm-proved", "the machine proved it holds TPM endorsement key "+ek[:min(16, len(ek))]+"…", map[string]string{"ek": ek, "token_id": c.ID})
	return ek, nil
}

// withEK hands the verified EK identity (ek, "" for none) to the
// inventory's Register, which binds it to the record at the machine's
// first proof and requires it of every later report (docs/security.md,
// "Claims" and "What a TPM proves").
func (l *Lifecycle) withEK(opts inventory.RegisterOptions, bootMAC, ek string) inventory.RegisterOptions {
	if ek != "" {
		l.log.Debug("TPM endorsement key proved", "mac", bootMAC, "ek", ek)
	}
	opts.EKIdentity = ek
	return opts
}
