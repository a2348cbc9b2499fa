package provider

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/booldefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/mapplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/corralhq/corral/api/client"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
)

// osImageResource is corral_os_image: an OS image the appliance downloads
// from a URL and verifies against its declared SHA-256 and format
// (RegisterOSImage), waited for until READY; there is no update RPC, so
// any change replaces it; DeleteOSImage destroys it.
type osImageResource struct {
	c    *client.Client
	poll time.Duration
}

func newOSImageResource() resource.Resource { return &osImageResource{poll: 2 * time.Second} }

type osImageModel struct {
	Name             types.String `tfsdk:"name"`
	SourceURL        types.String `tfsdk:"source_url"`
	SHA256           types.String `tfsdk:"sha256"`
	Format           types.String `tfsdk:"format"`
	Labels           types.Map    `tfsdk:"labels"`
	WaitReady        types.Bool   `tfsdk:"wait_ready"`
	State            types.String `tfsdk:"state"`
	SizeBytes        types.Int64  `tfsdk:"size_bytes"`
	VirtualSizeBytes types.Int64  `tfsdk:"virtual_size_bytes"`
}

func (r *osImageResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_os_image"
}

func (r *osImageResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	keepInt := []planmodifier.Int64{int64planmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "An operating-system image the appliance downloads and verifies (OSImageService.RegisterOSImage), " +
			"for corral_machine's os_image. Any change replaces it. Import by name.",
		Attributes: map[string]schema.Attribute{
			"name":       schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "Image name."},
			"source_url": schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "http(s) URL the appliance downloads."},
			"sha256":     schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "SHA-256 of the file, 64 hex digits."},
			"format":     schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "RAW or QCOW2 (declared, never guessed)."},
			"labels": schema.MapAttribute{Optional: true, ElementType: types.StringType,
				PlanModifiers: []planmodifier.Map{mapplanmodifier.RequiresReplace()}, Description: "Labels."},
			"wait_ready": schema.BoolAttribute{Optional: true, Computed: true, Default: booldefault.StaticBool(true),
				Description: "Wait until READY (FAILED is an error)."},
			"state":              schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "PENDING, DOWNLOADING, READY or FAILED."},
			"size_bytes":         schema.Int64Attribute{Computed: true, PlanModifiers: keepInt, Description: "File size."},
			"virtual_size_bytes": schema.Int64Attribute{Computed: true, PlanModifiers: keepInt, Description: "Disk size it needs."},
		},
	}
}

func (r *osImageResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = configuredClient(req.ProviderData, &resp.Diagnostics)
}

func osImageToModel(img *osimagev1.OSImage, m *osImageModel) {
	m.Name = types.StringValue(img.GetName())
	m.SourceURL = types.StringValue(img.GetSourceUrl())
	m.SHA256 = types.StringValue(img.GetSha256())
	m.Format = types.StringValue(strings.TrimPrefix(img.GetFormat().String(), "OS_IMAGE_FORMAT_"))
	m.Labels = mapValue(m.Labels, img.GetLabels())
	m.State = types.StringValue(strings.TrimPrefix(img.GetState().String(), "OS_IMAGE_STATE_"))
	m.SizeBytes = types.Int64Value(int64(img.GetSizeBytes()))
	m.VirtualSizeBytes = types.Int64Value(int64(img.GetVirtualSizeBytes()))
	if m.WaitReady.IsNull() || m.WaitReady.IsUnknown() { // imported
		m.WaitReady = types.BoolValue(true)
	}
}

func (r *osImageResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m osImageModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	format, ok := osimagev1.OSImageFormat_value["OS_IMAGE_FORMAT_"+strings.ToUpper(m.Format.ValueString())]
	if !ok || format == 0 {
		resp.Diagnostics.AddAttributeError(path.Root("format"), "Unknown image format", fmt.Sprintf("%q: want RAW or QCOW2", m.Format.ValueString()))
		return
	}
	labels := stringMap(ctx, m.Labels, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	name := m.Name.ValueString()
	out, err := r.c.OSImages.RegisterOSImage(ctx, &osimagev1.RegisterOSImageRequest{
		Name: name, Labels: labels, SourceUrl: m.SourceURL.ValueString(), Sha256: m.SHA256.ValueString(),
		Format: osimagev1.OSImageFormat(format),
	})
	if err != nil {
		apiError(&resp.Diagnostics, "RegisterOSImage "+name, err)
		return
	}
	img := out.GetOsImage()
	osImageToModel(img, &m)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...) // tainted if the wait fails
	for m.WaitReady.ValueBool() && !resp.Diagnostics.HasError() {
		switch img.GetState() {
		case osimagev1.OSImageState_OS_IMAGE_STATE_READY:
			return
		case osimagev1.OSImageState_OS_IMAGE_STATE_FAILED:
			resp.Diagnostics.AddError("OS image "+name+" FAILED", img.GetReason())
			return
		default:
		}
		select {
		case <-ctx.Done():
			resp.Diagnostics.AddError("OS image "+name+" not READY", fmt.Sprintf("%s, %d bytes received: %v", m.State.ValueString(), img.GetReceivedBytes(), ctx.Err()))
			return
		case <-time.After(r.poll):
		}
		got, err := r.c.OSImages.GetOSImage(ctx, &osimagev1.GetOSImageRequest{Name: name})
		if err != nil {
			apiError(&resp.Diagnostics, "GetOSImage "+name, err)
			return
		}
		img = got.GetOsImage()
		osImageToModel(img, &m)
		resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
	}
}

func (r *osImageResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	refresh(ctx, r.c, req, resp, "GetOSImage", func(m *osImageModel) string { return m.Name.ValueString() },
		func(ctx context.Context, name string) (*osimagev1.OSImage, error) {
			got, err := r.c.OSImages.GetOSImage(ctx, &osimagev1.GetOSImageRequest{Name: name})
			return got.GetOsImage(), err
		},
		func(img *osimagev1.OSImage, m *osImageModel, _ *diag.Diagnostics) { osImageToModel(img, m) })
}

// Update sees only wait_ready (everything else replaces).
func (r *osImageResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var m osImageModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *osImageResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m osImageModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	if _, err := r.c.OSImages.DeleteOSImage(ctx, &osimagev1.DeleteOSImageRequest{Name: m.Name.ValueString()}); err != nil && !isNotFound(err) {
		apiError(&resp.Diagnostics, "DeleteOSImage "+m.Name.ValueString(), err)
	}
}

func (r *osImageResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("name"), req, resp)
}
