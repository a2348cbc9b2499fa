package session

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// TPM is the machine's TPM 2.0 as the agent proves its endorsement key
// with it (agent/tpm.Device). Both calls block on the TPM.
type TPM interface {
	// Begin returns the EK, its certificate and the attestation key to
	// send in AttestBegin (the boot MAC is the client's to fill).
	Begin() (*nodev1.AttestBeginRequest, error)
	// Activate recovers a challenge's secret.
	Activate(*nodev1.AttestBeginResponse) ([]byte, error)
}

// proveTPM asks the appliance for a challenge and answers it with the
// TPM, for the Register that follows. It returns no proof (and says why
// on the console) when the TPM fails or the appliance checks no TPM
// proofs or refuses the key: the machine then registers as one without a
// TPM, and the appliance's claim rules decide. A transport failure is
// returned, to try the next appliance.
func proveTPM(ctx context.Context, cfg *Config, client nodev1.AgentServiceClient) (*nodev1.TpmProof, error) {
	if cfg.TPM == nil {
		return nil, nil
	}
	req, err := cfg.TPM.Begin()
	if err != nil {
		fmt.Fprintf(cfg.Console, "corral: TPM: %v; registering without a TPM proof\n", err)
		cfg.Logger.Warn("TPM unusable", "err", err)
		return nil, nil
	}
	req.BootMac = cfg.BootMAC
	rctx, cancel := context.WithTimeout(ctx, cfg.RPCTimeout)
	defer cancel()
	ch, err := client.AttestBegin(rctx, req)
	switch status.Code(err) {
	case codes.OK:
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted:
		return nil, fmt.Errorf("TPM challenge: %w", err)
	default:
		fmt.Fprintf(cfg.Console, "corral: TPM challenge refused: %s; registering without a TPM proof\n", reason(err))
		cfg.Logger.Warn("TPM challenge refused", "err", err)
		return nil, nil
	}
	secret, err := cfg.TPM.Activate(ch)
	if err != nil {
		fmt.Fprintf(cfg.Console, "corral: TPM: %v; registering without a TPM proof\n", err)
		cfg.Logger.Warn("TPM credential activation failed", "err", err)
		return nil, nil
	}
	return &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}, nil
}
