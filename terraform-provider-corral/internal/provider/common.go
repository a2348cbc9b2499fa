package provider

import (
	"context"
	"fmt"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/corralhq/corral/api/client"
)

// apiError turns a failed RPC into one diagnostic: the summary names what
// was attempted and the gRPC code, the detail is corrald's message and,
// for the codes an operator can act on, what to check.
func apiError(diags *diag.Diagnostics, what string, err error) {
	st := status.Convert(err)
	detail := st.Message()
	switch st.Code() {
	case codes.Unauthenticated:
		detail += "\n\nThe token was refused: check the provider's token or configuration file."
	case codes.PermissionDenied:
		detail += "\n\nThe token's role does not allow this call: changes need an operator token."
	case codes.Unavailable, codes.DeadlineExceeded:
		detail += "\n\ncorrald did not answer: check the endpoint and that the appliance is running."
	case codes.FailedPrecondition:
		detail += "\n\nThe object is not in a state that allows this; see its state with `corral get`."
	case codes.InvalidArgument:
		detail += "\n\ncorrald refused a value of the configuration."
	case codes.AlreadyExists:
		detail += "\n\nAn object of that name exists: import it (tofu import) or pick another name."
	default:
		// corrald's message says it all.
	}
	diags.AddError(fmt.Sprintf("%s: %s", what, st.Code()), detail)
}

func isNotFound(err error) bool { return status.Code(err) == codes.NotFound }

// configuredClient is the *client.Client the provider handed over, or nil
// (with an error added) when Configure was given something else.
func configuredClient(data any, diags *diag.Diagnostics) *client.Client {
	if data == nil {
		return nil
	}
	c, ok := data.(*client.Client)
	if !ok {
		diags.AddError("Unexpected provider data", fmt.Sprintf("want *client.Client, got %T", data))
		return nil
	}
	return c
}

// stringMap reads a map(string) attribute; null or unknown is empty.
func stringMap(ctx context.Context, m types.Map, diags *diag.Diagnostics) map[string]string {
	out := map[string]string{}
	if m.IsNull() || m.IsUnknown() {
		return out
	}
	diags.Append(m.ElementsAs(ctx, &out, false)...)
	return out
}

// mapValue is the attribute for got: null when got is empty and the prior
// value was null, so an unset attribute does not show as a change.
func mapValue(prior types.Map, got map[string]string) types.Map {
	if len(got) == 0 && (prior.IsNull() || prior.IsUnknown()) {
		return types.MapNull(types.StringType)
	}
	el := map[string]attr.Value{}
	for k, v := range got {
		el[k] = types.StringValue(v)
	}
	mv, _ := types.MapValue(types.StringType, el)
	return mv
}

// stringList reads a list(string) attribute; null or unknown is empty.
func stringList(ctx context.Context, l types.List, diags *diag.Diagnostics) []string {
	var out []string
	if l.IsNull() || l.IsUnknown() {
		return out
	}
	diags.Append(l.ElementsAs(ctx, &out, false)...)
	return out
}

// listValue is the attribute for got, null when empty and the prior was null.
func listValue(prior types.List, got []string) types.List {
	if len(got) == 0 && (prior.IsNull() || prior.IsUnknown()) {
		return types.ListNull(types.StringType)
	}
	el := make([]attr.Value, len(got))
	for i, v := range got {
		el[i] = types.StringValue(v)
	}
	lv, _ := types.ListValue(types.StringType, el)
	return lv
}

// optString is "" as null when the prior value was null, so an optional
// attribute left out does not show as a change.
func optString(prior types.String, got string) types.String {
	if got == "" && prior.IsNull() {
		return types.StringNull()
	}
	return types.StringValue(got)
}

// optInt64 is 0 as null when the prior value was null.
func optInt64(prior types.Int64, got int64) types.Int64 {
	if got == 0 && prior.IsNull() {
		return types.Int64Null()
	}
	return types.Int64Value(got)
}

// needClient reports whether the provider was configured with a client,
// adding an error when it was not (its settings were unknown at plan time).
func needClient(c *client.Client, diags *diag.Diagnostics) bool {
	if c == nil {
		diags.AddError("Provider not configured", "The corral provider has no connection: its settings were not known when this ran.")
		return false
	}
	return true
}

// refresh is the Read the named resources share: it fetches the object the
// state names (get); one deleted behind Terraform's back leaves the state,
// so the next plan creates it again; an error is one diagnostic naming the
// RPC; otherwise fill copies the object into the model, which becomes the
// new state (drift shows in the next plan).
func refresh[M any, T any](ctx context.Context, c *client.Client, req resource.ReadRequest, resp *resource.ReadResponse,
	rpc string, name func(*M) string, get func(context.Context, string) (T, error), fill func(T, *M, *diag.Diagnostics)) {
	var m M
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || !needClient(c, &resp.Diagnostics) {
		return
	}
	obj, err := get(ctx, name(&m))
	if isNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		apiError(&resp.Diagnostics, rpc+" "+name(&m), err)
		return
	}
	fill(obj, &m, &resp.Diagnostics)
	if resp.Diagnostics.HasError() {
		return
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}
