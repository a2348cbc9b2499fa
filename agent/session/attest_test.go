package session

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

type fakeTPM struct{ beginErr, activateErr error }

func (f fakeTPM) Begin() (*nodev1.AttestBeginRequest, error) {
	if f.beginErr != nil {
		return nil, f.beginErr
	}
	return &nodev1.AttestBeginRequest{EkPublic: []byte("ek")}, nil
}

func (f fakeTPM) Activate(ch *nodev1.AttestBeginResponse) ([]byte, error) {
	if f.activateErr != nil {
		return nil, f.activateErr
	}
	return append([]byte("secret-of-"), ch.GetCredential()...), nil
}

// attestClient answers AttestBegin with err, or a challenge; it records
// the request.
type attestClient struct {
	nodev1.AgentServiceClient
	err error
	got *nodev1.AttestBeginRequest
}

func (c *attestClient) AttestBegin(_ context.Context, req *nodev1.AttestBeginRequest, _ ...grpc.CallOption) (*nodev1.AttestBeginResponse, error) {
	c.got = req
	if c.err != nil {
		return nil, c.err
	}
	return &nodev1.AttestBeginResponse{ChallengeId: "c1", Credential: []byte("cred")}, nil
}

func TestProveTPM(t *testing.T) {
	for name, tc := range map[string]struct {
		tpm       TPM
		rpcErr    error
		wantProof bool
		wantErr   bool
		console   string
	}{
		"no TPM":             {},
		"proof":              {tpm: fakeTPM{}, wantProof: true},
		"TPM fails":          {tpm: fakeTPM{beginErr: errors.New("EK CreatePrimary failed")}, console: "registering without a TPM proof"},
		"activation fails":   {tpm: fakeTPM{activateErr: errors.New("integrity check failed")}, console: "registering without a TPM proof"},
		"old appliance":      {tpm: fakeTPM{}, rpcErr: status.Error(codes.Unimplemented, "unknown method"), console: "TPM challenge refused"},
		"EK refused":         {tpm: fakeTPM{}, rpcErr: status.Error(codes.PermissionDenied, "EK certificate: unknown authority"), console: "unknown authority"},
		"appliance unusable": {tpm: fakeTPM{}, rpcErr: status.Error(codes.Unavailable, "connection refused"), wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			var console strings.Builder
			cfg := &Config{BootMAC: "52:54:00:00:72:01", TPM: tc.tpm, Console: &console, Logger: slog.New(slog.DiscardHandler), RPCTimeout: time.Second}
			client := &attestClient{err: tc.rpcErr}
			proof, err := proveTPM(context.Background(), cfg, client)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if (proof != nil) != tc.wantProof {
				t.Fatalf("proof %v, want one: %v", proof, tc.wantProof)
			}
			if tc.wantProof && (proof.GetChallengeId() != "c1" || string(proof.GetSecret()) != "secret-of-cred" || client.got.GetBootMac() != cfg.BootMAC) {
				t.Fatalf("proof %v for request %v", proof, client.got)
			}
			if !strings.Contains(console.String(), tc.console) {
				t.Fatalf("console %q, want it to say %q", console.String(), tc.console)
			}
		})
	}
}
