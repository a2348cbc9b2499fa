// Package provider is the Corral Terraform/OpenTofu provider
// (terraform-plugin-framework): its configuration, resources and data
// sources, each a thin mapping between a Terraform schema and one corrald
// service reached through github.com/corralhq/corral/api/client. It must
// not import the appliance module: only the api module.
package provider

import (
	"context"
	"os"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/corralhq/corral/api/client"
	"github.com/corralhq/corral/api/clientconfig"
)

// Address is the provider's registry address; a CLI configuration's
// dev_overrides names it to use a local build.
const Address = "registry.opentofu.org/corralhq/corral"

// New returns the provider factory providerserver serves.
func New(version string) func() provider.Provider {
	return func() provider.Provider { return &corralProvider{version: version} }
}

type corralProvider struct {
	version string
	// open connects; tests replace it to serve fakes.
	open func(cfg providerModel) (*client.Client, error)
}

type providerModel struct {
	ConfigPath types.String `tfsdk:"config_path"`
	Context    types.String `tfsdk:"context"`
	Endpoint   types.String `tfsdk:"endpoint"`
	CACert     types.String `tfsdk:"ca_cert"`
	Token      types.String `tfsdk:"token"`
}

func (p *corralProvider) Metadata(_ context.Context, _ provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = "corral"
	resp.Version = p.version
}

func (p *corralProvider) Schema(_ context.Context, _ provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "Corral bare-metal appliance. Connects as the corral CLI does: a client configuration file " +
			"(config_path, default $CORRAL_CONFIG or ~/.config/corral/config.yaml; corrald's admin.conf works too) " +
			"and one of its contexts, or endpoint, ca_cert and token given here.",
		Attributes: map[string]schema.Attribute{
			"config_path": schema.StringAttribute{Optional: true,
				Description: "Client configuration file (default $CORRAL_CONFIG, else ~/.config/corral/config.yaml)."},
			"context": schema.StringAttribute{Optional: true,
				Description: "Context of the configuration file to use (default: its current context)."},
			"endpoint": schema.StringAttribute{Optional: true,
				Description: "corrald's gRPC address host:port; with ca_cert and token instead of a file."},
			"ca_cert": schema.StringAttribute{Optional: true,
				Description: "PEM of the appliance CA (with endpoint)."},
			"token": schema.StringAttribute{Optional: true, Sensitive: true,
				Description: "Bearer token (with endpoint); an operator token to change things."},
		},
	}
}

// clientConfig resolves the provider block to a connection configuration.
func clientConfig(m providerModel) (*clientconfig.Config, string, error) {
	if ep := m.Endpoint.ValueString(); ep != "" {
		return &clientconfig.Config{Endpoint: ep, CACert: m.CACert.ValueString(), Token: m.Token.ValueString()}, "", nil
	}
	p := m.ConfigPath.ValueString()
	if p == "" {
		var err error
		if p, err = client.DefaultConfigPath(); err != nil {
			return nil, "", err
		}
	}
	f, err := clientconfig.LoadFile(p)
	if err != nil {
		return nil, p, err
	}
	cfg, err := f.Context(m.Context.ValueString())
	if err != nil {
		return nil, p, err
	}
	return cfg, p, nil
}

func (p *corralProvider) Configure(ctx context.Context, req provider.ConfigureRequest, resp *provider.ConfigureResponse) {
	var m providerModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if m.Endpoint.IsUnknown() || m.ConfigPath.IsUnknown() || m.Token.IsUnknown() || m.CACert.IsUnknown() || m.Context.IsUnknown() {
		// Known only after apply: resources will be planned without a client.
		return
	}
	if m.Endpoint.ValueString() != "" && (m.ConfigPath.ValueString() != "" || m.Context.ValueString() != "") {
		resp.Diagnostics.AddAttributeError(path.Root("endpoint"), "Conflicting connection settings",
			"Set either endpoint (with ca_cert and token) or config_path/context, not both.")
		return
	}
	if m.Endpoint.ValueString() == "" && (m.Token.ValueString() != "" || m.CACert.ValueString() != "") {
		resp.Diagnostics.AddAttributeError(path.Root("endpoint"), "Missing endpoint",
			"token and ca_cert are used only with endpoint.")
		return
	}
	open := p.open
	if open == nil {
		open = func(m providerModel) (*client.Client, error) {
			cfg, file, err := clientConfig(m)
			if err != nil {
				if file != "" && os.Getenv(client.EnvConfig) == "" && m.ConfigPath.IsNull() {
					return nil, &configError{file: file, err: err}
				}
				return nil, err
			}
			return client.New(cfg)
		}
	}
	c, err := open(m)
	if err != nil {
		resp.Diagnostics.AddError("Cannot connect to Corral", err.Error())
		return
	}
	resp.ResourceData = c
	resp.DataSourceData = c
}

// configError names the default file the provider fell back to.
type configError struct {
	file string
	err  error
}

func (e *configError) Error() string {
	return e.err.Error() + " (no config_path or endpoint in the provider block: the default " + e.file + " was read)"
}

func (p *corralProvider) Resources(context.Context) []func() resource.Resource {
	return []func() resource.Resource{newNetworkResource, newBlockStorageResource, newVirtualMachineResource, newMachineResource, newOSImageResource}
}

func (p *corralProvider) DataSources(context.Context) []func() datasource.DataSource {
	return []func() datasource.DataSource{newNodesDataSource, newMachinesDataSource}
}
