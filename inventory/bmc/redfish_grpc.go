package bmc

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/grpc"
)

// RedfishServer serves BmcRedfishService over a Redfish.
type RedfishServer struct {
	inventoryv1.UnimplementedBmcRedfishServiceServer
	Redfish *Redfish
}

// RegisterRedfish registers BmcRedfishService on s.
func RegisterRedfish(s grpc.ServiceRegistrar, srv *RedfishServer) {
	inventoryv1.RegisterBmcRedfishServiceServer(s, srv)
}

// GetBios runs Redfish.GetBIOS.
func (s *RedfishServer) GetBios(ctx context.Context, req *inventoryv1.GetBiosRequest) (*inventoryv1.GetBiosResponse, error) {
	b, err := s.Redfish.GetBIOS(ctx, req.GetName())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.GetBiosResponse{Bios: b}, nil
}

// SetBios runs Redfish.SetBIOS.
func (s *RedfishServer) SetBios(ctx context.Context, req *inventoryv1.SetBiosRequest) (*inventoryv1.SetBiosResponse, error) {
	b, err := s.Redfish.SetBIOS(ctx, req.GetName(), req.GetSettings())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.SetBiosResponse{Bios: b}, nil
}

// ListFirmware runs Redfish.ListFirmware.
func (s *RedfishServer) ListFirmware(ctx context.Context, req *inventoryv1.ListFirmwareRequest) (*inventoryv1.ListFirmwareResponse, error) {
	fw, err := s.Redfish.ListFirmware(ctx, req.GetName())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.ListFirmwareResponse{Firmware: fw}, nil
}

// UpdateFirmware runs Redfish.UpdateFirmware.
func (s *RedfishServer) UpdateFirmware(ctx context.Context, req *inventoryv1.UpdateFirmwareRequest) (*inventoryv1.UpdateFirmwareResponse, error) {
	resp, err := s.Redfish.UpdateFirmware(ctx, req)
	return resp, apierr.ToStatus(err)
}

// InsertMedia runs Redfish.InsertMedia.
func (s *RedfishServer) InsertMedia(ctx context.Context, req *inventoryv1.InsertMediaRequest) (*inventoryv1.InsertMediaResponse, error) {
	resp, err := s.Redfish.InsertMedia(ctx, req)
	return resp, apierr.ToStatus(err)
}

// EjectMedia runs Redfish.EjectMedia.
func (s *RedfishServer) EjectMedia(ctx context.Context, req *inventoryv1.EjectMediaRequest) (*inventoryv1.EjectMediaResponse, error) {
	resp, err := s.Redfish.EjectMedia(ctx, req.GetName())
	return resp, apierr.ToStatus(err)
}
