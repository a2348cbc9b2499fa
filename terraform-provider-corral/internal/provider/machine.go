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
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/listplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/corralhq/corral/api/client"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// machineResource is corral_machine: a bare-metal machine allocated from
// the READY pool (AllocateMachines, one machine), optionally deployed with
// an OS image and cloud-init (DeployMachine), released on destroy
// (ReleaseMachine, with the chosen erase). The machine is the allocation:
// released or re-allocated behind Terraform's back, it is planned again.
type machineResource struct {
	c *client.Client
	// poll is the pause between reads while waiting for DEPLOYED.
	poll time.Duration
}

func newMachineResource() resource.Resource { return &machineResource{poll: 5 * time.Second} }

type machineResModel struct {
	Selector     types.String `tfsdk:"selector"`
	Pool         types.String `tfsdk:"pool"`
	OSImage      types.String `tfsdk:"os_image"`
	Layout       types.String `tfsdk:"layout"`
	UserData     types.String `tfsdk:"user_data"`
	SSHKeys      types.List   `tfsdk:"ssh_keys"`
	Hostname     types.String `tfsdk:"hostname"`
	WaitDeployed types.Bool   `tfsdk:"wait_deployed"`
	Erase        types.String `tfsdk:"erase"`
	Name         types.String `tfsdk:"name"`
	AllocationID types.String `tfsdk:"allocation_id"`
	State        types.String `tfsdk:"state"`
	BootMAC      types.String `tfsdk:"boot_mac"`
	Address      types.String `tfsdk:"address"`
}

func (r *machineResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_machine"
}

// askedChanged replaces the machine when what was asked changes, but not
// when the prior value is null: an imported machine adopts the
// configuration's request as it is.
func askedChanged(_ context.Context, req planmodifier.StringRequest, resp *stringplanmodifier.RequiresReplaceIfFuncResponse) {
	resp.RequiresReplace = !req.StateValue.IsNull()
}

func askedListChanged(_ context.Context, req planmodifier.ListRequest, resp *listplanmodifier.RequiresReplaceIfFuncResponse) {
	resp.RequiresReplace = !req.StateValue.IsNull()
}

func (r *machineResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	const why = "A change of what was asked replaces the machine (release, allocate again)."
	replace := []planmodifier.String{stringplanmodifier.RequiresReplaceIf(askedChanged, why, why)}
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "A bare-metal machine allocated from the READY pool and, with os_image, deployed (MachineService " +
			"AllocateMachines, DeployMachine; ReleaseMachine on destroy). Any change of what was asked replaces it: " +
			"release, then a new allocation. Import by machine name (an allocated machine).",
		Attributes: map[string]schema.Attribute{
			"selector": schema.StringAttribute{Optional: true, PlanModifiers: replace,
				Description: `Selector terms over facts, labels, zone and pool: "zone=a,cpu.cores>=16".`},
			"pool":     schema.StringAttribute{Optional: true, PlanModifiers: replace, Description: "Short for a pool=POOL term."},
			"os_image": schema.StringAttribute{Optional: true, PlanModifiers: replace, Description: "READY OS image to deploy; unset: allocate only."},
			"layout":   schema.StringAttribute{Optional: true, PlanModifiers: replace, Description: "Disk layout (YAML); default: the image onto the boot disk."},
			"user_data": schema.StringAttribute{Optional: true, Sensitive: true, PlanModifiers: replace,
				Description: "cloud-init user data (at most 64 KiB)."},
			"ssh_keys": schema.ListAttribute{Optional: true, ElementType: types.StringType,
				PlanModifiers: []planmodifier.List{listplanmodifier.RequiresReplaceIf(askedListChanged, why, why)}, Description: "Authorized keys of the image's default user."},
			"hostname": schema.StringAttribute{Optional: true, PlanModifiers: replace, Description: "Hostname (default: the machine's name)."},
			"wait_deployed": schema.BoolAttribute{Optional: true, Computed: true, Default: booldefault.StaticBool(true),
				Description: "With os_image: wait until the OS has booted and phoned home (DEPLOYED); FAILED is an error."},
			"erase": schema.StringAttribute{Optional: true, Computed: true, Default: stringdefault.StaticString("DEFAULT"),
				Description: "Erase on release: DEFAULT (the pool's), NONE, QUICK or FULL."},
			"name":          schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The machine allocated."},
			"allocation_id": schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The allocation; another one means the machine was released."},
			"state":         schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "ALLOCATED, DEPLOYING, DEPLOYED, ..."},
			"boot_mac":      schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "MAC the machine boots from."},
			"address":       schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "IPv4 address (CIDR) of the deployed OS."},
		},
	}
}

func (r *machineResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.c = configuredClient(req.ProviderData, &resp.Diagnostics)
}

func machineToModel(m *inventoryv1.Machine, s *machineResModel) {
	s.Name = types.StringValue(m.GetName())
	s.AllocationID = types.StringValue(m.GetAllocation().GetAllocationId())
	s.State = types.StringValue(m.GetState().String())
	s.BootMAC = types.StringValue(m.GetBootMac())
	s.Address = types.StringValue(m.GetDeployment().GetAddress())
	// The image deployed: another one (redeployed elsewhere) shows as a
	// change; none yet (allocated only, or mid-deploy) keeps what was asked.
	if img := m.GetDeployment().GetOsImage(); img != "" {
		s.OSImage = types.StringValue(img)
	}
}

func eraseLevel(s string) (inventoryv1.EraseLevel, error) {
	v, ok := inventoryv1.EraseLevel_value["ERASE_LEVEL_"+strings.ToUpper(s)]
	if !ok {
		return 0, fmt.Errorf("erase %q: want DEFAULT, NONE, QUICK or FULL", s)
	}
	return inventoryv1.EraseLevel(v), nil
}

func (r *machineResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var s machineResModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &s)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	if _, err := eraseLevel(s.Erase.ValueString()); err != nil {
		resp.Diagnostics.AddAttributeError(path.Root("erase"), "Unknown erase level", err.Error())
		return
	}
	keys := stringList(ctx, s.SSHKeys, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	a, err := r.c.Machines.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{
		Selector: s.Selector.ValueString(), Pool: s.Pool.ValueString(), Count: 1,
	})
	if err != nil {
		apiError(&resp.Diagnostics, "AllocateMachines", err)
		return
	}
	if len(a.GetMachines()) != 1 {
		resp.Diagnostics.AddError("AllocateMachines", fmt.Sprintf("corrald allocated %d machines, want 1", len(a.GetMachines())))
		return
	}
	m := a.GetMachines()[0]
	image := s.OSImage.ValueString()
	machineToModel(m, &s)
	// Saved now: a failed deploy leaves the allocation in state (tainted),
	// so the next apply releases it instead of leaking it.
	resp.Diagnostics.Append(resp.State.Set(ctx, &s)...)
	if image == "" || resp.Diagnostics.HasError() {
		return
	}
	m, err = r.c.Machines.DeployMachine(ctx, &inventoryv1.DeployMachineRequest{
		Name: m.GetName(), OsImage: image, Layout: s.Layout.ValueString(),
		UserData: []byte(s.UserData.ValueString()), SshKeys: keys, Hostname: s.Hostname.ValueString(),
	})
	if err != nil {
		apiError(&resp.Diagnostics, "DeployMachine "+s.Name.ValueString(), err)
		return
	}
	if s.WaitDeployed.ValueBool() {
		m = r.waitDeployed(ctx, m, &resp.Diagnostics)
	}
	machineToModel(m, &s)
	resp.Diagnostics.Append(resp.State.Set(ctx, &s)...)
}

// waitDeployed reads m until it is DEPLOYED, FAILED (an error) or ctx ends.
func (r *machineResource) waitDeployed(ctx context.Context, m *inventoryv1.Machine, diags *diag.Diagnostics) *inventoryv1.Machine {
	for {
		switch m.GetState() {
		case inventoryv1.Machine_DEPLOYED:
			return m
		case inventoryv1.Machine_FAILED:
			diags.AddError("Deploy of "+m.GetName()+" failed", m.GetStateReason()+" "+m.GetDeployment().GetError())
			return m
		default:
		}
		select {
		case <-ctx.Done():
			diags.AddError("Deploy of "+m.GetName()+" not finished", fmt.Sprintf("still %s (%s): %v", m.GetState(), m.GetDeployment().GetStep(), ctx.Err()))
			return m
		case <-time.After(r.poll):
		}
		next, err := r.c.Machines.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: m.GetName()})
		if err != nil {
			apiError(diags, "GetMachine "+m.GetName(), err)
			return m
		}
		m = next
	}
}

func (r *machineResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var s machineResModel
	resp.Diagnostics.Append(req.State.Get(ctx, &s)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	m, err := r.c.Machines.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: s.Name.ValueString()})
	if isNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "GetMachine "+s.Name.ValueString(), err)
		return
	}
	al := m.GetAllocation()
	if al == nil || al.GetReleasedAt() != nil ||
		(s.AllocationID.ValueString() != "" && al.GetAllocationId() != s.AllocationID.ValueString()) {
		// Released (or allocated again) behind Terraform's back: this
		// allocation is gone.
		resp.State.RemoveResource(ctx)
		return
	}
	machineToModel(m, &s)
	if s.WaitDeployed.IsNull() { // imported
		s.WaitDeployed = types.BoolValue(true)
	}
	if s.Erase.IsNull() {
		s.Erase = types.StringValue("DEFAULT")
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &s)...)
}

// Update sees wait_deployed and erase (Terraform-side settings), and what
// was asked when the machine was imported (adopted as configured).
func (r *machineResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var s machineResModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &s)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if _, err := eraseLevel(s.Erase.ValueString()); err != nil {
		resp.Diagnostics.AddAttributeError(path.Root("erase"), "Unknown erase level", err.Error())
		return
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &s)...)
}

func (r *machineResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var s machineResModel
	resp.Diagnostics.Append(req.State.Get(ctx, &s)...)
	if resp.Diagnostics.HasError() || !needClient(r.c, &resp.Diagnostics) {
		return
	}
	level, err := eraseLevel(s.Erase.ValueString())
	if err != nil {
		resp.Diagnostics.AddAttributeError(path.Root("erase"), "Unknown erase level", err.Error())
		return
	}
	name := s.Name.ValueString()
	m, err := r.c.Machines.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: name})
	if isNotFound(err) {
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, "GetMachine "+name, err)
		return
	}
	if al := m.GetAllocation(); al == nil || al.GetReleasedAt() != nil || al.GetAllocationId() != s.AllocationID.ValueString() {
		return // this allocation already ended
	}
	if _, err := r.c.Machines.ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: name, Erase: level, Reason: "released by terraform destroy"}); err != nil && !isNotFound(err) {
		apiError(&resp.Diagnostics, "ReleaseMachine "+name, err)
	}
}

// ImportState takes a machine name; Read fills the rest from its current
// allocation (and deployment).
func (r *machineResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("name"), req, resp)
}
