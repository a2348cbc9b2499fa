package fleet

import (
	"context"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/grpc"
)

// Service is the ApplianceService: ListAppliances shows the fleet from the
// store; FetchArtifact is served by the function another part of the
// appliance sets (Unimplemented while it is nil). Register exactly one
// Service per gRPC server.
type Service struct {
	Store store.Store
	// Leader names the current leader ("" while none is elected).
	Leader func(ctx context.Context) (string, error)
	// Expiry is how long a runner stays live after its heartbeat (default
	// DefaultExpiry).
	Expiry time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// FetchArtifact serves a peer's FetchArtifact; nil answers
	// Unimplemented. Set it before the server serves.
	FetchArtifact func(*fleetv1.FetchArtifactRequest, grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error
}

// Register registers svc on s as the ApplianceService server.
func Register(s grpc.ServiceRegistrar, svc *Service) {
	fleetv1.RegisterApplianceServiceServer(s, &edge{svc: svc})
}

// edge is the gRPC server of a Service: errors become statuses here.
type edge struct {
	fleetv1.UnimplementedApplianceServiceServer
	svc *Service
}

// Appliances lists the runner records (undecodable ones left out) with
// their status fields filled:
// role (LEADER for the leader's record, RUNNER when live, EXPIRED when
// not) and assigned (the machines the assignments give each). It returns
// the leader's name too.
func (svc *Service) Appliances(ctx context.Context) ([]*fleetv1.Appliance, string, error) {
	if svc.Store == nil {
		return nil, "", apierr.Unavailablef("fleet: no store")
	}
	apps, err := listAppliances(ctx, svc.Store)
	if err != nil {
		return nil, "", err
	}
	kvs, err := svc.Store.List(ctx, AssignmentPrefix)
	if err != nil {
		return nil, "", err
	}
	assigned := map[string]uint32{}
	for _, kv := range kvs {
		var a fleetv1.Assignment
		if record.Unmarshal(kv.Value, &a) == nil {
			assigned[a.GetRunner()]++
		}
	}
	leader := ""
	if svc.Leader != nil {
		if leader, err = svc.Leader(ctx); err != nil {
			return nil, "", err
		}
	}
	now := time.Now()
	if svc.Now != nil {
		now = svc.Now()
	}
	expiry := svc.Expiry
	if expiry <= 0 {
		expiry = DefaultExpiry
	}
	for _, a := range apps {
		switch {
		case a.GetName() == leader:
			a.Role = fleetv1.Appliance_LEADER
		case !Live(a, now, expiry):
			a.Role = fleetv1.Appliance_EXPIRED
		default:
			a.Role = fleetv1.Appliance_RUNNER
		}
		a.Assigned = assigned[a.GetName()]
	}
	return apps, leader, nil
}

// ListAppliances implements ApplianceService.
func (e *edge) ListAppliances(ctx context.Context, req *fleetv1.ListAppliancesRequest) (*fleetv1.ListAppliancesResponse, error) {
	apps, leader, err := e.svc.Appliances(ctx)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	paging.SortByKey(apps, (*fleetv1.Appliance).GetName)
	page, next, err := paging.Slice(apps, (*fleetv1.Appliance).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &fleetv1.ListAppliancesResponse{Appliances: page, Leader: leader, NextPageToken: next}, nil
}

// FetchArtifact implements ApplianceService through Service.FetchArtifact.
func (e *edge) FetchArtifact(req *fleetv1.FetchArtifactRequest, stream grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
	if e.svc.FetchArtifact == nil {
		return e.UnimplementedApplianceServiceServer.FetchArtifact(req, stream)
	}
	return apierr.ToStatus(e.svc.FetchArtifact(req, stream))
}
