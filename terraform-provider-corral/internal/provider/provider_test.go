package provider

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	fwprovider "github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSchemas checks every schema the way the framework does when the
// CLI asks for it (attribute names, plan modifiers on computed values).
func TestSchemas(t *testing.T) {
	ctx := context.Background()
	p := New("test")()
	var ps fwprovider.SchemaResponse
	p.Schema(ctx, fwprovider.SchemaRequest{}, &ps)
	if ps.Diagnostics.HasError() {
		t.Fatal(ps.Diagnostics)
	}
	if d := ps.Schema.ValidateImplementation(ctx); d.HasError() {
		t.Errorf("provider schema: %v", d)
	}
	names := map[string]bool{}
	for _, f := range p.Resources(ctx) {
		r := f()
		var md resource.MetadataResponse
		r.Metadata(ctx, resource.MetadataRequest{ProviderTypeName: "corral"}, &md)
		names[md.TypeName] = true
		var sr resource.SchemaResponse
		r.Schema(ctx, resource.SchemaRequest{}, &sr)
		if d := sr.Schema.ValidateImplementation(ctx); d.HasError() || sr.Diagnostics.HasError() {
			t.Errorf("%s: %v %v", md.TypeName, d, sr.Diagnostics)
		}
		if _, ok := r.(resource.ResourceWithImportState); !ok {
			t.Errorf("%s cannot be imported", md.TypeName)
		}
	}
	for _, f := range p.DataSources(ctx) {
		d := f()
		var md datasource.MetadataResponse
		d.Metadata(ctx, datasource.MetadataRequest{ProviderTypeName: "corral"}, &md)
		names[md.TypeName] = true
		var sr datasource.SchemaResponse
		d.Schema(ctx, datasource.SchemaRequest{}, &sr)
		if v := sr.Schema.ValidateImplementation(ctx); v.HasError() {
			t.Errorf("%s: %v", md.TypeName, v)
		}
	}
	for _, want := range []string{"corral_network", "corral_block_storage", "corral_virtual_machine", "corral_machine", "corral_os_image", "corral_nodes", "corral_machines"} {
		if !names[want] {
			t.Errorf("%s missing; have %v", want, names)
		}
	}
}

// TestAPIError: a failed RPC is one diagnostic naming the call and the
// gRPC code, with corrald's message and a hint for the actionable codes.
func TestAPIError(t *testing.T) {
	for name, tc := range map[string]struct {
		err          error
		summary      string
		detailHasAll []string
	}{
		"denied": {status.Error(codes.PermissionDenied, "role viewer may not call ApplyNetwork"),
			"ApplyNetwork n: PermissionDenied", []string{"role viewer may not call ApplyNetwork", "operator token"}},
		"down": {status.Error(codes.Unavailable, "connection refused"),
			"ApplyNetwork n: Unavailable", []string{"connection refused", "check the endpoint"}},
		"invalid": {status.Error(codes.InvalidArgument, `block storage "d": limit_bytes 1 < current 2`),
			"ApplyNetwork n: InvalidArgument", []string{"limit_bytes 1 < current 2", "refused a value"}},
		"not a status": {errors.New("boom"), "ApplyNetwork n: Unknown", []string{"boom"}},
	} {
		t.Run(name, func(t *testing.T) {
			var d diag.Diagnostics
			apiError(&d, "ApplyNetwork n", tc.err)
			if len(d) != 1 || d[0].Severity() != diag.SeverityError {
				t.Fatalf("diagnostics %v, want one error", d)
			}
			if d[0].Summary() != tc.summary {
				t.Errorf("summary %q, want %q", d[0].Summary(), tc.summary)
			}
			for _, w := range tc.detailHasAll {
				if !strings.Contains(d[0].Detail(), w) {
					t.Errorf("detail %q lacks %q", d[0].Detail(), w)
				}
			}
		})
	}
}
