package bmc

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/grpc"
)

// CredentialServer serves BmcCredentialService over a Service.
type CredentialServer struct {
	inventoryv1.UnimplementedBmcCredentialServiceServer
	BMC *Service
}

// RegisterCredentials registers BmcCredentialService on s.
func RegisterCredentials(s grpc.ServiceRegistrar, srv *CredentialServer) {
	inventoryv1.RegisterBmcCredentialServiceServer(s, srv)
}

// RotateBmcCredentials runs Service.Rotate. The steps go back whether it
// succeeded or not (an error's steps are in the log and the timeline).
func (s *CredentialServer) RotateBmcCredentials(ctx context.Context, req *inventoryv1.RotateBmcCredentialsRequest) (*inventoryv1.RotateBmcCredentialsResponse, error) {
	m, steps, err := s.BMC.Rotate(ctx, req.GetName())
	if err != nil {
		s.BMC.log.Info("BMC credential rotation failed", "machine", req.GetName(), "steps", steps, "err", err)
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.RotateBmcCredentialsResponse{Bmc: m.GetBmc(), Steps: steps}, nil
}

// ForgetBmcHostKey runs Service.ForgetConsoleHostKey.
func (s *CredentialServer) ForgetBmcHostKey(ctx context.Context, req *inventoryv1.ForgetBmcHostKeyRequest) (*inventoryv1.ForgetBmcHostKeyResponse, error) {
	m, was, err := s.BMC.ForgetConsoleHostKey(ctx, req.GetName(), req.GetExpect())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.ForgetBmcHostKeyResponse{Bmc: m.GetBmc(), Forgotten: was}, nil
}
