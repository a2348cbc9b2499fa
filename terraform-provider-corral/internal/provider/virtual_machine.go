package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/listplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/corralhq/corral/api/client"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// virtualMachineResource is corral_virtual_machine: CreateVirtualMachine
// (disks attached, compute reserved, NICs reserved on their networks, QEMU
// booted on the node), labels changed in place (UpdateVirtualMachine),
// everything else replaces it; DeleteVirtualMachine destroys it and
// releases its disks and addresses.
type virtualMachineResource struct{ c *client.Client }

func newVirtualMachineResource() resource.Resource { return &virtualMachineResource{} }

type vmModel struct {
	Name               types.String `tfsdk:"name"`
	RequestCPUMilli    types.Int64  `tfsdk:"request_cpu_milli_core"`
	LimitCPUMilli      types.Int64  `tfsdk:"limit_cpu_milli_core"`
	RequestMemoryBytes types.Int64  `tfsdk:"request_memory_bytes"`
	LimitMemoryBytes   types.Int64  `tfsdk:"limit_memory_bytes"`
	BlockStorageNames  types.List   `tfsdk:"block_storage_names"`
	NICs               types.List   `tfsdk:"nics"`
	LoginUsername      types.String `tfsdk:"login_username"`
	SSHAuthorizedKeys  types.List   `tfsdk:"ssh_authorized_keys"`
	NodeName           types.String `tfsdk:"node_name"`
	Labels             types.Map    `tfsdk:"labels"`
	UUID               types.String `tfsdk:"uuid"`
	State              types.String `tfsdk:"state"`
}

type nicModel struct {
	NetworkName     types.String `tfsdk:"network_name"`
	IPv4Address     types.String `tfsdk:"ipv4_address"`
	IPv6Address     types.String `tfsdk:"ipv6_address"`
	HardwareAddress types.String `tfsdk:"hardware_address"`
}

var nicAttrTypes = map[string]attr.Type{
	"network_name": types.StringType, "ipv4_address": types.StringType,
	"ipv6_address": types.StringType, "hardware_address": types.StringType,
}

func (r *virtualMachineResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_virtual_machine"
}

func (r *virtualMachineResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	replaceInt := []planmodifier.Int64{int64planmodifier.RequiresReplace()}
	replaceList := []planmodifier.List{listplanmodifier.RequiresReplace()}
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "A virtual machine on a node of the pool (VirtualMachineService). Labels change in place; any other " +
			"change replaces the VM. Import by name.",
		Attributes: map[string]schema.Attribute{
			"name":                   schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "VM name."},
			"request_cpu_milli_core": schema.Int64Attribute{Required: true, PlanModifiers: replaceInt, Description: "CPU reserved, in milli-cores."},
			"limit_cpu_milli_core":   schema.Int64Attribute{Required: true, PlanModifiers: replaceInt, Description: "CPU limit, in milli-cores (vCPUs = limit/1000)."},
			"request_memory_bytes":   schema.Int64Attribute{Required: true, PlanModifiers: replaceInt, Description: "Memory reserved."},
			"limit_memory_bytes":     schema.Int64Attribute{Required: true, PlanModifiers: replaceInt, Description: "Guest memory."},
			"block_storage_names": schema.ListAttribute{Optional: true, ElementType: types.StringType, PlanModifiers: replaceList,
				Description: "Disks, in order (corral_block_storage names, all on the VM's node)."},
			"nics": schema.ListNestedAttribute{Optional: true, PlanModifiers: replaceList, Description: "Network interfaces.",
				NestedObject: schema.NestedAttributeObject{Attributes: map[string]schema.Attribute{
					"network_name": schema.StringAttribute{Required: true, Description: "corral_network name."},
					"ipv4_address": schema.StringAttribute{Optional: true, Computed: true, PlanModifiers: keep,
						Description: "Static IPv4 address (default: allocated from the network)."},
					"ipv6_address": schema.StringAttribute{Optional: true, Computed: true, PlanModifiers: keep,
						Description: "Static IPv6 address."},
					"hardware_address": schema.StringAttribute{Optional: true, Computed: true, PlanModifiers: keep,
						Description: "MAC address (default: generated)."},
				}}},
			"login_username": schema.StringAttribute{Optional: true, PlanModifiers: replace, Description: "cloud-init login user."},
			"ssh_authorized_keys": schema.ListAttribute{Optional: true, ElementType: types.StringType, PlanModifiers: replaceList,
				Description: "Public keys for login_username."},
			"node_name": schema.StringAttribute{Optional: true, Computed: true,
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplaceIfConfigured(), stringplanmodifier.UseStateForUnknown()},
				Description:   "Node to run on (default: the disks' node, or one corrald picks)."},
			"labels": schema.MapAttribute{Optional: true, ElementType: types.StringType, Description: "Labels (changed in place)."},
			"uuid":   schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "SMBIOS UUID."},
			"state":  schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "RUNNING, SHUTDOWN, ..."},
		},
	}
}

func (r *virtualMachineResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = configuredClient(req.ProviderData, &resp.Diagnostics)
}

func vmToModel(vm *provisioningv1.VirtualMachine, m *vmModel, diags *diag.Diagnostics) {
	m.Name = types.StringValue(vm.GetName())
	m.RequestCPUMilli = types.Int64Value(int64(vm.GetRequestCpuMilliCore()))
	m.LimitCPUMilli = types.Int64Value(int64(vm.GetLimitCpuMilliCore()))
	m.RequestMemoryBytes = types.Int64Value(int64(vm.GetRequestMemoryBytes()))
	m.LimitMemoryBytes = types.Int64Value(int64(vm.GetLimitMemoryBytes()))
	m.BlockStorageNames = listValue(m.BlockStorageNames, vm.GetBlockStorageNames())
	m.LoginUsername = optString(m.LoginUsername, vm.GetLoginUsername())
	m.SSHAuthorizedKeys = listValue(m.SSHAuthorizedKeys, vm.GetSshAuthorizedKeys())
	m.NodeName = types.StringValue(vm.GetComputeNodeName())
	m.Labels = mapValue(m.Labels, vm.GetLabels())
	m.UUID = types.StringValue(vm.GetUuid())
	m.State = types.StringValue(vm.GetState().String())
	objType := types.ObjectType{AttrTypes: nicAttrTypes}
	if len(vm.GetNics()) == 0 && (m.NICs.IsNull() || m.NICs.IsUnknown()) {
		m.NICs = types.ListNull(objType)
		return
	}
	var nics []attr.Value
	for _, n := range vm.GetNics() {
		o, d := types.ObjectValue(nicAttrTypes, map[string]attr.Value{
			"network_name":     types.StringValue(n.GetNetworkName()),
			"ipv4_address":     types.StringValue(n.GetIpv4Address()),
			"ipv6_address":     types.StringValue(n.GetIpv6Address()),
			"hardware_address": types.StringValue(n.GetHardwareAddress()),
		})
		diags.Append(d...)
		nics = append(nics, o)
	}
	l, d := types.ListValue(objType, nics)
	diags.Append(d...)
	m.NICs = l
}

func (r *virtualMachineResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m vmModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	d := &resp.Diagnostics
	creq := &provisioningv1.CreateVirtualMachineRequest{
		Name:                m.Name.ValueString(),
		Annotations:         map[string]string{},
		Labels:              stringMap(ctx, m.Labels, d),
		RequestCpuMilliCore: uint32(m.RequestCPUMilli.ValueInt64()),
		LimitCpuMilliCore:   uint32(m.LimitCPUMilli.ValueInt64()),
		RequestMemoryBytes:  uint64(m.RequestMemoryBytes.ValueInt64()),
		LimitMemoryBytes:    uint64(m.LimitMemoryBytes.ValueInt64()),
		BlockStorageNames:   stringList(ctx, m.BlockStorageNames, d),
		LoginUsername:       m.LoginUsername.ValueString(),
		SshAuthorizedKeys:   stringList(ctx, m.SSHAuthorizedKeys, d),
	}
	if n := m.NodeName.ValueString(); n != "" {
		creq.Annotations[annVMNode] = n
	}
	if !m.NICs.IsNull() && !m.NICs.IsUnknown() {
		var nics []nicModel
		d.Append(m.NICs.ElementsAs(ctx, &nics, false)...)
		for _, n := range nics {
			creq.Nics = append(creq.Nics, &provisioningv1.VirtualMachineNIC{
				NetworkName:     n.NetworkName.ValueString(),
				Ipv4Address:     n.IPv4Address.ValueString(),
				Ipv6Address:     n.IPv6Address.ValueString(),
				HardwareAddress: n.HardwareAddress.ValueString(),
			})
		}
	}
	if d.HasError() {
		return
	}
	vm, err := r.c.VirtualMachines.CreateVirtualMachine(ctx, creq)
	if err != nil {
		apiError(d, "CreateVirtualMachine "+creq.Name, err)
		return
	}
	vmToModel(vm, &m, d)
	d.Append(resp.State.Set(ctx, &m)...)
}

func (r *virtualMachineResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	refresh(ctx, r.c, req, resp, "GetVirtualMachine", func(m *vmModel) string { return m.Name.ValueString() },
		func(ctx context.Context, name string) (*provisioningv1.VirtualMachine, error) {
			return r.c.VirtualMachines.GetVirtualMachine(ctx, &provisioningv1.GetVirtualMachineRequest{Name: name})
		}, vmToModel)
}

func (r *virtualMachineResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var m vmModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	labels := stringMap(ctx, m.Labels, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	// Only labels reach Update (everything else replaces): zero compute
	// fields keep the current sizes.
	vm, err := r.c.VirtualMachines.UpdateVirtualMachine(ctx, &provisioningv1.UpdateVirtualMachineRequest{
		Name: m.Name.ValueString(), Labels: labels,
	})
	if err != nil {
		apiError(&resp.Diagnostics, "UpdateVirtualMachine "+m.Name.ValueString(), err)
		return
	}
	vmToModel(vm, &m, &resp.Diagnostics)
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *virtualMachineResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m vmModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	_, err := r.c.VirtualMachines.DeleteVirtualMachine(ctx, &provisioningv1.DeleteVirtualMachineRequest{Name: m.Name.ValueString()})
	if err != nil && !isNotFound(err) {
		apiError(&resp.Diagnostics, "DeleteVirtualMachine "+m.Name.ValueString(), err)
	}
}

func (r *virtualMachineResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("name"), req, resp)
}
