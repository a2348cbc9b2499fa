package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/corralhq/corral/api/client"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// Annotations corrald reads on create requests (n0stack's names).
const (
	annBlockStorageNode = "n0core/provisioning/block_storage/request_node_name"
	annVMNode           = "n0core/provisioning/virtual_machine/request_node_name"
)

// blockStorageResource is corral_block_storage: a qcow2 volume on a node,
// blank (CreateBlockStorage) or downloaded (FetchBlockStorage); updated
// in place for labels and growth (UpdateBlockStorage); destroyed with
// DeleteBlockStorage then PurgeBlockStorage, so nothing is left.
type blockStorageResource struct{ c *client.Client }

func newBlockStorageResource() resource.Resource { return &blockStorageResource{} }

type blockStorageModel struct {
	Name         types.String `tfsdk:"name"`
	RequestBytes types.Int64  `tfsdk:"request_bytes"`
	LimitBytes   types.Int64  `tfsdk:"limit_bytes"`
	NodeName     types.String `tfsdk:"node_name"`
	SourceURL    types.String `tfsdk:"source_url"`
	SourceSHA256 types.String `tfsdk:"source_sha256"`
	Labels       types.Map    `tfsdk:"labels"`
	State        types.String `tfsdk:"state"`
	StorageName  types.String `tfsdk:"storage_name"`
}

func (r *blockStorageResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_block_storage"
}

func (r *blockStorageResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		Description: "A block storage volume (qcow2) on a node of the pool (BlockStorageService). Growing limit_bytes and " +
			"changing labels update it in place; shrinking is refused by corrald. Destroy deletes and purges it. Import by name.",
		Attributes: map[string]schema.Attribute{
			"name":          schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "Volume name."},
			"request_bytes": schema.Int64Attribute{Required: true, Description: "Bytes reserved in the node's budget."},
			"limit_bytes":   schema.Int64Attribute{Required: true, Description: "Virtual size of the volume; it can grow, not shrink."},
			"node_name": schema.StringAttribute{Optional: true, Computed: true,
				Description:   "Node to create the volume on (default: corrald picks one). Changing it replaces the volume.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplaceIfConfigured(), stringplanmodifier.UseStateForUnknown()}},
			"source_url": schema.StringAttribute{Optional: true, PlanModifiers: replace,
				Description: "http(s) URL of an image the node downloads into the volume (FetchBlockStorage); unset: a blank volume."},
			"source_sha256": schema.StringAttribute{Optional: true, PlanModifiers: replace,
				Description: "SHA-256 (hex) the download must have."},
			"labels": schema.MapAttribute{Optional: true, ElementType: types.StringType, Description: "Labels."},
			"state": schema.StringAttribute{Computed: true, Description: "AVAILABLE, IN_USE (attached to a VM), ...",
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()}},
			"storage_name": schema.StringAttribute{Computed: true, Description: "The node's name for the volume.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()}},
		},
	}
}

func (r *blockStorageResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = configuredClient(req.ProviderData, &resp.Diagnostics)
}

func blockStorageToModel(bs *provisioningv1.BlockStorage, m *blockStorageModel) {
	m.Name = types.StringValue(bs.GetName())
	m.RequestBytes = types.Int64Value(int64(bs.GetRequestBytes()))
	m.LimitBytes = types.Int64Value(int64(bs.GetLimitBytes()))
	m.NodeName = types.StringValue(bs.GetNodeName())
	m.Labels = mapValue(m.Labels, bs.GetLabels())
	m.State = types.StringValue(bs.GetState().String())
	m.StorageName = types.StringValue(bs.GetStorageName())
	if m.SourceURL.IsUnknown() {
		m.SourceURL = types.StringNull()
	}
	if m.SourceSHA256.IsUnknown() {
		m.SourceSHA256 = types.StringNull()
	}
}

func (r *blockStorageResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m blockStorageModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	ann := map[string]string{}
	if n := m.NodeName.ValueString(); n != "" {
		ann[annBlockStorageNode] = n
	}
	labels := stringMap(ctx, m.Labels, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	name := m.Name.ValueString()
	var bs *provisioningv1.BlockStorage
	var err error
	if u := m.SourceURL.ValueString(); u != "" {
		bs, err = r.c.BlockStorages.FetchBlockStorage(ctx, &provisioningv1.FetchBlockStorageRequest{
			Name: name, Annotations: ann, Labels: labels,
			RequestBytes: uint64(m.RequestBytes.ValueInt64()), LimitBytes: uint64(m.LimitBytes.ValueInt64()),
			SourceUrl: u, SourceSha256: m.SourceSHA256.ValueString(),
		})
		if err != nil {
			apiError(&resp.Diagnostics, "FetchBlockStorage "+name, err)
			return
		}
	} else {
		bs, err = r.c.BlockStorages.CreateBlockStorage(ctx, &provisioningv1.CreateBlockStorageRequest{
			Name: name, Annotations: ann, Labels: labels,
			RequestBytes: uint64(m.RequestBytes.ValueInt64()), LimitBytes: uint64(m.LimitBytes.ValueInt64()),
		})
		if err != nil {
			apiError(&resp.Diagnostics, "CreateBlockStorage "+name, err)
			return
		}
	}
	blockStorageToModel(bs, &m)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *blockStorageResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	refresh(ctx, r.c, req, resp, "GetBlockStorage", func(m *blockStorageModel) string { return m.Name.ValueString() },
		func(ctx context.Context, name string) (*provisioningv1.BlockStorage, error) {
			return r.c.BlockStorages.GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: name})
		},
		func(bs *provisioningv1.BlockStorage, m *blockStorageModel, _ *diag.Diagnostics) {
			blockStorageToModel(bs, m)
		})
}

func (r *blockStorageResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var m blockStorageModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	labels := stringMap(ctx, m.Labels, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	bs, err := r.c.BlockStorages.UpdateBlockStorage(ctx, &provisioningv1.UpdateBlockStorageRequest{
		Name: m.Name.ValueString(), Labels: labels,
		RequestBytes: uint64(m.RequestBytes.ValueInt64()), LimitBytes: uint64(m.LimitBytes.ValueInt64()),
	})
	if err != nil {
		apiError(&resp.Diagnostics, "UpdateBlockStorage "+m.Name.ValueString(), err)
		return
	}
	blockStorageToModel(bs, &m)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *blockStorageResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m blockStorageModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	deleteBlockStorage(ctx, r.c, m.Name.ValueString(), &resp.Diagnostics)
}

// deleteBlockStorage is Delete (AVAILABLE → DELETED, skipped when already
// DELETED) then Purge (the node removes the file, the record goes).
func deleteBlockStorage(ctx context.Context, c *client.Client, name string, diags *diag.Diagnostics) {
	bs, err := c.BlockStorages.GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: name})
	if isNotFound(err) {
		return
	}
	if err != nil {
		apiError(diags, "GetBlockStorage "+name, err)
		return
	}
	if bs.GetState() != provisioningv1.BlockStorage_DELETED {
		if _, err := c.BlockStorages.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: name}); err != nil {
			if isNotFound(err) {
				return
			}
			apiError(diags, "DeleteBlockStorage "+name, err)
			return
		}
	}
	if _, err := c.BlockStorages.PurgeBlockStorage(ctx, &provisioningv1.PurgeBlockStorageRequest{Name: name}); err != nil && !isNotFound(err) {
		apiError(diags, "PurgeBlockStorage "+name, err)
	}
}

func (r *blockStorageResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("name"), req, resp)
}
