package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/datasource/schema"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/corralhq/corral/api/client"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// nodesDataSource is corral_nodes: every hypervisor node (ListNodes, all
// pages).
type nodesDataSource struct{ c *client.Client }

func newNodesDataSource() datasource.DataSource { return &nodesDataSource{} }

type nodesModel struct {
	Nodes []nodeModel `tfsdk:"nodes"`
}

type nodeModel struct {
	Name          types.String `tfsdk:"name"`
	Address       types.String `tfsdk:"address"`
	State         types.String `tfsdk:"state"`
	CPUMilliCores types.Int64  `tfsdk:"cpu_milli_cores"`
	MemoryBytes   types.Int64  `tfsdk:"memory_bytes"`
	StorageBytes  types.Int64  `tfsdk:"storage_bytes"`
	Labels        types.Map    `tfsdk:"labels"`
}

func (d *nodesDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_nodes"
}

func (d *nodesDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "The hypervisor nodes of the pool.",
		Attributes: map[string]schema.Attribute{
			"nodes": schema.ListNestedAttribute{Computed: true, NestedObject: schema.NestedAttributeObject{
				Attributes: map[string]schema.Attribute{
					"name":            schema.StringAttribute{Computed: true},
					"address":         schema.StringAttribute{Computed: true},
					"state":           schema.StringAttribute{Computed: true, Description: "READY or NOT_READY."},
					"cpu_milli_cores": schema.Int64Attribute{Computed: true},
					"memory_bytes":    schema.Int64Attribute{Computed: true},
					"storage_bytes":   schema.Int64Attribute{Computed: true},
					"labels":          schema.MapAttribute{Computed: true, ElementType: types.StringType},
				}}},
		},
	}
}

func (d *nodesDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.c = configuredClient(req.ProviderData, &resp.Diagnostics)
}

func (d *nodesDataSource) Read(ctx context.Context, _ datasource.ReadRequest, resp *datasource.ReadResponse) {
	if !needClient(d.c, &resp.Diagnostics) {
		return
	}
	m := nodesModel{Nodes: []nodeModel{}}
	token := ""
	for {
		page, err := d.c.Nodes.ListNodes(ctx, &poolv1.ListNodesRequest{PageSize: 1000, PageToken: token})
		if err != nil {
			apiError(&resp.Diagnostics, "ListNodes", err)
			return
		}
		for _, n := range page.GetNodes() {
			m.Nodes = append(m.Nodes, nodeModel{
				Name: types.StringValue(n.GetName()), Address: types.StringValue(n.GetAddress()),
				State:         types.StringValue(n.GetState().String()),
				CPUMilliCores: types.Int64Value(int64(n.GetCpuMilliCores())),
				MemoryBytes:   types.Int64Value(int64(n.GetMemoryBytes())),
				StorageBytes:  types.Int64Value(int64(n.GetStorageBytes())),
				Labels:        mapValue(types.MapUnknown(types.StringType), n.GetLabels()),
			})
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

// machinesDataSource is corral_machines: the bare-metal inventory
// (ListMachines, summary view, all pages), optionally narrowed to a state
// and label selectors.
type machinesDataSource struct{ c *client.Client }

func newMachinesDataSource() datasource.DataSource { return &machinesDataSource{} }

type machinesModel struct {
	State     types.String   `tfsdk:"state"`
	Selectors []types.String `tfsdk:"selectors"`
	Machines  []machineModel `tfsdk:"machines"`
}

type machineModel struct {
	Name     types.String `tfsdk:"name"`
	Serial   types.String `tfsdk:"serial"`
	BootMAC  types.String `tfsdk:"boot_mac"`
	State    types.String `tfsdk:"state"`
	Zone     types.String `tfsdk:"zone"`
	Pool     types.String `tfsdk:"pool"`
	NodeName types.String `tfsdk:"node_name"`
	Labels   types.Map    `tfsdk:"labels"`
}

func (d *machinesDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_machines"
}

func (d *machinesDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "Bare-metal machines of the inventory.",
		Attributes: map[string]schema.Attribute{
			"state": schema.StringAttribute{Optional: true, Description: "Only machines in this state (READY, DEPLOYED, ...)."},
			"selectors": schema.ListAttribute{Optional: true, ElementType: types.StringType,
				Description: "Label selectors (key=value, key!=value, key), all of which must match."},
			"machines": schema.ListNestedAttribute{Computed: true, NestedObject: schema.NestedAttributeObject{
				Attributes: map[string]schema.Attribute{
					"name":      schema.StringAttribute{Computed: true},
					"serial":    schema.StringAttribute{Computed: true},
					"boot_mac":  schema.StringAttribute{Computed: true},
					"state":     schema.StringAttribute{Computed: true},
					"zone":      schema.StringAttribute{Computed: true},
					"pool":      schema.StringAttribute{Computed: true},
					"node_name": schema.StringAttribute{Computed: true},
					"labels":    schema.MapAttribute{Computed: true, ElementType: types.StringType},
				}}},
		},
	}
}

func (d *machinesDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.c = configuredClient(req.ProviderData, &resp.Diagnostics)
}

func (d *machinesDataSource) Read(ctx context.Context, req datasource.ReadRequest, resp *datasource.ReadResponse) {
	var m machinesModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(d.c, &resp.Diagnostics) {
		return
	}
	lreq := &inventoryv1.ListMachinesRequest{PageSize: 1000, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}
	if s := m.State.ValueString(); s != "" {
		v, ok := inventoryv1.Machine_MachineState_value[s]
		if !ok || v == 0 {
			resp.Diagnostics.AddError("Unknown machine state", "state "+s+" is not a machine state (READY, DEPLOYED, FAILED, ...)")
			return
		}
		lreq.State = inventoryv1.Machine_MachineState(v)
	}
	for _, s := range m.Selectors {
		lreq.Selectors = append(lreq.Selectors, s.ValueString())
	}
	m.Machines = []machineModel{}
	for {
		page, err := d.c.Machines.ListMachines(ctx, lreq)
		if err != nil {
			apiError(&resp.Diagnostics, "ListMachines", err)
			return
		}
		for _, x := range page.GetMachines() {
			m.Machines = append(m.Machines, machineModel{
				Name: types.StringValue(x.GetName()), Serial: types.StringValue(x.GetSerial()),
				BootMAC: types.StringValue(x.GetBootMac()), State: types.StringValue(x.GetState().String()),
				Zone: types.StringValue(x.GetZone()), Pool: types.StringValue(x.GetPool()),
				NodeName: types.StringValue(x.GetNodeName()),
				Labels:   mapValue(types.MapUnknown(types.StringType), x.GetLabels()),
			})
		}
		if lreq.PageToken = page.GetNextPageToken(); lreq.PageToken == "" {
			break
		}
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}
