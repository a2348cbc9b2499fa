package deploy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/descriptorpb"

	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// widgetFiles is protoregistry.GlobalFiles plus corral.widget.v1, a
// package with one service no Go code is generated for:
//
//	message Part { string label = 1; }
//	message ApplyWidgetRequest { string name = 1; string colour = 2; repeated Part parts = 3; }
//	service WidgetService { rpc ApplyWidget(ApplyWidgetRequest) returns (ApplyWidgetRequest); }
func widgetFiles(t *testing.T) *protoregistry.Files {
	t.Helper()
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	fdp := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("corral/widget/v1/widget.proto"),
		Package: proto.String("corral.widget.v1"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Part"), Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("label"), JsonName: proto.String("label"), Number: proto.Int32(1), Type: str, Label: opt},
			}},
			{Name: proto.String("ApplyWidgetRequest"), Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("name"), JsonName: proto.String("name"), Number: proto.Int32(1), Type: str, Label: opt},
				{Name: proto.String("colour"), JsonName: proto.String("colour"), Number: proto.Int32(2), Type: str, Label: opt},
				{
					Name: proto.String("parts"), JsonName: proto.String("parts"), Number: proto.Int32(3),
					Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".corral.widget.v1.Part"),
					Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(),
				},
			}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("WidgetService"),
			Method: []*descriptorpb.MethodDescriptorProto{{
				Name:       proto.String("ApplyWidget"),
				InputType:  proto.String(".corral.widget.v1.ApplyWidgetRequest"),
				OutputType: proto.String(".corral.widget.v1.ApplyWidgetRequest"),
			}},
		}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	files := new(protoregistry.Files)
	protoregistry.GlobalFiles.RangeFiles(func(f protoreflect.FileDescriptor) bool {
		if err := files.RegisterFile(f); err != nil {
			t.Fatal(err)
		}
		return true
	})
	if err := files.RegisterFile(fd); err != nil {
		t.Fatal(err)
	}
	return files
}

var widgetKind = Kind{Name: "widget", Aliases: []string{"wd"}, Type: "Widget", Apply: "ApplyWidget"}

// document decodes a JSON apply document the way the CLI does.
func document(t *testing.T, r *Registry, doc string, opts DecodeOptions) (*Document, error) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.UseNumber()
	var fields map[string]any
	if err := dec.Decode(&fields); err != nil {
		t.Fatal(err)
	}
	return r.Document(fields, opts)
}

// TestKindAddedIsVisibleToDoAndApply adds a service and a kind to a
// registry and reaches it both ways: as a task of a DAG file (corral do)
// and as an apply document (corral apply), with the same request and the
// same refusal of an unknown field.
func TestKindAddedIsVisibleToDoAndApply(t *testing.T) {
	r, err := NewRegistry(widgetFiles(t), append(DefaultKinds(), widgetKind)...)
	if err != nil {
		t.Fatal(err)
	}
	const args = `{"name": "w1", "colour": "red", "parts": [{"label": "a"}]}`
	want := `{"name":"w1","colour":"red","parts":[{"label":"a"}]}`

	plan, err := r.Parse([]byte("w:\n  type: Widget\n  action: ApplyWidget\n  args: " + args + "\n"))
	if err != nil {
		t.Fatalf("do: %v", err)
	}
	task := plan.Task("w")
	doc, err := document(t, r, `{"kind": "WD", `+args[1:], DecodeOptions{})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if doc.Kind.Name != "widget" || doc.Method.Path != task.Method.Path || task.Method.Path != "/corral.widget.v1.WidgetService/ApplyWidget" {
		t.Errorf("apply reaches %s %s, do reaches %s", doc.Kind.Name, doc.Method.Path, task.Method.Path)
	}
	for what, m := range map[string]proto.Message{"do": task.Request, "apply": doc.Request} {
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(compactJSON(t, want), compactJSON(t, string(b))); diff != "" {
			t.Errorf("%s request (-want +got):\n%s", what, diff)
		}
	}

	// The same unknown field, refused by both with the same words.
	const refused = `unknown field "parts[0].labl" in Part (valid: label) (did you mean "label"?)`
	_, err = r.Parse([]byte("w:\n  type: Widget\n  action: ApplyWidget\n  args: {name: w1, parts: [{labl: a}]}\n"))
	if err == nil || !strings.Contains(err.Error(), "args of Widget.ApplyWidget: "+refused) {
		t.Errorf("do: %v, want %q", err, refused)
	}
	_, err = document(t, r, `{"kind": "widget", "name": "w1", "parts": [{"labl": "a"}]}`, DecodeOptions{})
	if err == nil || err.Error() != "widget (ApplyWidgetRequest): "+refused {
		t.Errorf("apply: %v, want %q", err, refused)
	}

	// The default registry knows neither.
	if _, err := Parse([]byte("w:\n  type: Widget\n  action: ApplyWidget\n")); err == nil || !strings.Contains(err.Error(), `unknown type "Widget"`) {
		t.Errorf("default registry, do: %v", err)
	}
	if _, err := document(t, DefaultRegistry(), `{"kind": "widget", "name": "w1"}`, DecodeOptions{}); err == nil || !strings.Contains(err.Error(), `unknown kind "widget"`) {
		t.Errorf("default registry, apply: %v", err)
	}
}

func compactJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestUnknownFieldRefusedByBoth sends every appliable kind's request with
// an unknown field through both entry points of the default registry.
func TestUnknownFieldRefusedByBoth(t *testing.T) {
	r := DefaultRegistry()
	n := 0
	for _, k := range r.Kinds() {
		if k.Apply == "" {
			continue
		}
		n++
		t.Run(k.Name, func(t *testing.T) {
			_, doErr := r.Parse([]byte("t:\n  type: " + k.Type + "\n  action: " + k.Apply + "\n  args: {name: x, colour: red}\n"))
			_, applyErr := document(t, r, `{"kind": "`+k.Name+`", "name": "x", "colour": "red"}`, DecodeOptions{})
			if doErr == nil || applyErr == nil {
				t.Fatalf("accepted: do %v, apply %v", doErr, applyErr)
			}
			_, doMsg, _ := strings.Cut(doErr.Error(), ": args of "+k.Type+"."+k.Apply+": ")
			_, applyMsg, _ := strings.Cut(applyErr.Error(), k.Name+" (")
			_, applyMsg, _ = strings.Cut(applyMsg, "): ")
			if !strings.HasPrefix(doMsg, `unknown field "colour" in `) || doMsg != applyMsg {
				t.Errorf("do says %q, apply says %q; want the same unknown field message", doErr, applyErr)
			}
		})
	}
	if n < 5 {
		t.Errorf("only %d appliable kinds", n)
	}
}

func TestDocument(t *testing.T) {
	tests := map[string]struct {
		doc     string
		size    bool
		want    proto.Message // nil when refused
		action  string
		wantErr string
	}{
		"block storage without source_url is created": {
			doc:    `{"kind": "bs", "name": "d", "limit_bytes": 2048}`,
			want:   &provisioningv1.CreateBlockStorageRequest{Name: "d", LimitBytes: 2048},
			action: "CreateBlockStorage",
		},
		"block storage with source_url is fetched": {
			doc:    `{"kind": "block_storage", "name": "d", "source_url": "http://x/d.img"}`,
			want:   &provisioningv1.FetchBlockStorageRequest{Name: "d", SourceUrl: "http://x/d.img"},
			action: "FetchBlockStorage",
		},
		"JSON name of source_url": {
			doc:    `{"kind": "BlockStorage", "name": "d", "sourceUrl": "http://x/d.img"}`,
			want:   &provisioningv1.FetchBlockStorageRequest{Name: "d", SourceUrl: "http://x/d.img"},
			action: "FetchBlockStorage",
		},
		"sizes with the Size option": {
			doc:    `{"kind": "bs", "name": "d", "limit_bytes": "2KiB"}`,
			size:   true,
			want:   &provisioningv1.CreateBlockStorageRequest{Name: "d", LimitBytes: 2048},
			action: "CreateBlockStorage",
		},
		"no sizes without it, as in do": {
			doc:     `{"kind": "bs", "name": "d", "limit_bytes": "2KiB"}`,
			wantErr: `block_storage (CreateBlockStorageRequest): field "limit_bytes": want a number, got the string "2KiB"`,
		},
		"bad size": {
			doc:     `{"kind": "bs", "name": "d", "limit_bytes": "2XB"}`,
			size:    true,
			wantErr: `block_storage (CreateBlockStorageRequest): field "limit_bytes": bad size "2XB"`,
		},
		"missing kind": {
			doc:     `{"name": "d"}`,
			wantErr: "missing kind (valid: node, network, virtual_machine, block_storage, image, os_image)",
		},
		"kind not a string": {
			doc:     `{"kind": 3}`,
			wantErr: "kind must be a string",
		},
		"unknown kind": {
			doc:     `{"kind": "pod"}`,
			wantErr: `unknown kind "pod" (valid: node, network, virtual_machine, block_storage, image, os_image)`,
		},
		"kind that cannot be applied": {
			doc:     `{"kind": "machines"}`,
			wantErr: "kind machine cannot be applied (valid: node, network, virtual_machine, block_storage, image, os_image)",
		},
	}
	size := func(s string) (uint64, error) {
		if s == "2KiB" {
			return 2048, nil
		}
		return 0, &sizeError{s}
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var opts DecodeOptions
			if tc.size {
				opts.Size = size
			}
			d, err := document(t, DefaultRegistry(), tc.doc, opts)
			if tc.want == nil {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, d.Request, protocmp.Transform()); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if d.Method.Action != tc.action {
				t.Errorf("action %s, want %s", d.Method.Action, tc.action)
			}
		})
	}
}

type sizeError struct{ s string }

func (e *sizeError) Error() string { return "bad size " + `"` + e.s + `"` }

func TestKindLookup(t *testing.T) {
	r := DefaultRegistry()
	for name, want := range map[string]string{
		"vm": "virtual_machine", "Virtual-Machine": "virtual_machine", " VirtualMachine ": "virtual_machine",
		"BS": "block_storage", "net": "network", "machines": "machine",
		"": "", "pod": "", "n": "", "Node ": "node",
	} {
		got := ""
		if k, ok := r.Kind(name); ok {
			got = k.Name
		}
		if got != want {
			t.Errorf("Kind(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestNewRegistryRefusesBadKinds(t *testing.T) {
	tests := map[string]struct {
		kind Kind
		want string
	}{
		"no name":        {Kind{Type: "Node"}, `kind of type "Node" has no name`},
		"unknown type":   {Kind{Name: "pod", Type: "Pod"}, `kind pod: unknown type "Pod"`},
		"unknown action": {Kind{Name: "pod", Type: "Node", Apply: "ApplyPod"}, `kind pod: unknown action "ApplyPod" for type Node`},
		"streaming":      {Kind{Name: "pod", Type: "Agent", Apply: "Session"}, "kind pod: action Session of type Agent is a streaming RPC"},
		"name taken":     {Kind{Name: "Virtual-Machine", Type: "VirtualMachine"}, `kind Virtual-Machine: name "Virtual-Machine" is already taken by kind virtual_machine`},
		"alias taken":    {Kind{Name: "pod", Aliases: []string{"VM"}, Type: "VirtualMachine"}, `kind pod: name "VM" is already taken by kind virtual_machine`},
		"ApplyIf alone":  {Kind{Name: "pod", Type: "Node", ApplyIf: []FieldAction{{Field: "name", Action: "GetNode"}}}, "kind pod: ApplyIf without Apply"},
		"ApplyIf field":  {Kind{Name: "pod", Type: "Node", Apply: "ApplyNode", ApplyIf: []FieldAction{{Field: "nam", Action: "GetNode"}}}, `kind pod: GetNodeRequest has no field "nam"`},
		"ApplyIf action": {Kind{Name: "pod", Type: "Node", Apply: "ApplyNode", ApplyIf: []FieldAction{{Field: "name", Action: "Get"}}}, `kind pod: unknown action "Get" for type Node`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r, err := NewRegistry(protoregistry.GlobalFiles, append(DefaultKinds(), tc.kind)...)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("NewRegistry = %v, %v; want error %q", r, err, tc.want)
			}
		})
	}
}

// TestDefaultKinds checks the compiled-in kinds, which DefaultRegistry
// would otherwise panic on, and the help text they give apply.
func TestDefaultKinds(t *testing.T) {
	r, err := NewRegistry(protoregistry.GlobalFiles, DefaultKinds()...)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, k := range r.Kinds() {
		got[k.Name] = k.ApplyRequests()
	}
	want := map[string]string{
		"node":            "ApplyNodeRequest",
		"network":         "ApplyNetworkRequest",
		"virtual_machine": "CreateVirtualMachineRequest",
		"block_storage":   "CreateBlockStorageRequest; FetchBlockStorageRequest when source_url is set",
		"image":           "ApplyImageRequest",
		"os_image":        "RegisterOSImageRequest",
		"machine":         "",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
}
