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
	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// networkResource is corral_network: NetworkService.ApplyNetwork creates
// and updates (it replaces the whole spec), DeleteNetwork destroys.
type networkResource struct{ c *client.Client }

func newNetworkResource() resource.Resource { return &networkResource{} }

type networkModel struct {
	Name        types.String `tfsdk:"name"`
	IPv4CIDR    types.String `tfsdk:"ipv4_cidr"`
	IPv6CIDR    types.String `tfsdk:"ipv6_cidr"`
	Domain      types.String `tfsdk:"domain"`
	IPv4Gateway types.String `tfsdk:"ipv4_gateway"`
	IPv6Gateway types.String `tfsdk:"ipv6_gateway"`
	DNSServers  types.List   `tfsdk:"dns_servers"`
	VLANID      types.Int64  `tfsdk:"vlan_id"`
	Labels      types.Map    `tfsdk:"labels"`
	Annotations types.Map    `tfsdk:"annotations"`
	State       types.String `tfsdk:"state"`
}

func (r *networkResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_network"
}

func (r *networkResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "A network of the node pool (NetworkService): its address ranges, gateway, resolvers and VLAN. Import by name.",
		Attributes: map[string]schema.Attribute{
			"name": schema.StringAttribute{Required: true, Description: "Network name; changing it replaces the network.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()}},
			"ipv4_cidr":    schema.StringAttribute{Optional: true, Description: "IPv4 range, e.g. 192.168.0.0/24."},
			"ipv6_cidr":    schema.StringAttribute{Optional: true, Description: "IPv6 range."},
			"domain":       schema.StringAttribute{Optional: true, Description: "DNS domain."},
			"ipv4_gateway": schema.StringAttribute{Optional: true, Description: "IPv4 gateway address."},
			"ipv6_gateway": schema.StringAttribute{Optional: true, Description: "IPv6 gateway address."},
			"dns_servers":  schema.ListAttribute{Optional: true, ElementType: types.StringType, Description: "Resolvers handed to guests."},
			"vlan_id":      schema.Int64Attribute{Optional: true, Description: "802.1Q VLAN ID (0 or unset: untagged)."},
			"labels":       schema.MapAttribute{Optional: true, ElementType: types.StringType, Description: "Labels."},
			"annotations":  schema.MapAttribute{Optional: true, ElementType: types.StringType, Description: "Annotations."},
			"state": schema.StringAttribute{Computed: true, Description: "AVAILABLE once applied.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()}},
		},
	}
}

func (r *networkResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = configuredClient(req.ProviderData, &resp.Diagnostics)
}

func (r *networkResource) apply(ctx context.Context, m *networkModel, d *diag.Diagnostics) {
	req := &poolv1.ApplyNetworkRequest{
		Name:        m.Name.ValueString(),
		Ipv4Cidr:    m.IPv4CIDR.ValueString(),
		Ipv6Cidr:    m.IPv6CIDR.ValueString(),
		Domain:      m.Domain.ValueString(),
		Ipv4Gateway: m.IPv4Gateway.ValueString(),
		Ipv6Gateway: m.IPv6Gateway.ValueString(),
		DnsServers:  stringList(ctx, m.DNSServers, d),
		VlanId:      uint32(m.VLANID.ValueInt64()),
		Labels:      stringMap(ctx, m.Labels, d),
		Annotations: stringMap(ctx, m.Annotations, d),
	}
	if d.HasError() {
		return
	}
	n, err := r.c.Networks.ApplyNetwork(ctx, req)
	if err != nil {
		apiError(d, "ApplyNetwork "+req.Name, err)
		return
	}
	networkToModel(n, m)
}

// networkToModel copies what corrald holds into m, keeping unset optional
// attributes null when corrald holds their zero value.
func networkToModel(n *poolv1.Network, m *networkModel) {
	m.Name = types.StringValue(n.GetName())
	m.IPv4CIDR = optString(m.IPv4CIDR, n.GetIpv4Cidr())
	m.IPv6CIDR = optString(m.IPv6CIDR, n.GetIpv6Cidr())
	m.Domain = optString(m.Domain, n.GetDomain())
	m.IPv4Gateway = optString(m.IPv4Gateway, n.GetIpv4Gateway())
	m.IPv6Gateway = optString(m.IPv6Gateway, n.GetIpv6Gateway())
	m.DNSServers = listValue(m.DNSServers, n.GetDnsServers())
	m.VLANID = optInt64(m.VLANID, int64(n.GetVlanId()))
	m.Labels = mapValue(m.Labels, n.GetLabels())
	m.Annotations = mapValue(m.Annotations, n.GetAnnotations())
	m.State = types.StringValue(n.GetState().String())
}

func (r *networkResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m networkModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	r.apply(ctx, &m, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *networkResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	refresh(ctx, r.c, req, resp, "GetNetwork", func(m *networkModel) string { return m.Name.ValueString() },
		func(ctx context.Context, name string) (*poolv1.Network, error) {
			return r.c.Networks.GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: name})
		},
		func(n *poolv1.Network, m *networkModel, _ *diag.Diagnostics) { networkToModel(n, m) })
}

func (r *networkResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var m networkModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	r.apply(ctx, &m, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *networkResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m networkModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	_, err := r.c.Networks.DeleteNetwork(ctx, &poolv1.DeleteNetworkRequest{Name: m.Name.ValueString()})
	if err != nil && !isNotFound(err) {
		apiError(&resp.Diagnostics, "DeleteNetwork "+m.Name.ValueString(), err)
	}
}

func (r *networkResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("name"), req, resp)
}
