package auth

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/descriptorpb"

	// Every generated API package, so that each service is registered.
	// A new api/<name>/v1 package must be added here and to wantPackages.
	_ "github.com/corralhq/corral/api/auth/v1"
	_ "github.com/corralhq/corral/api/deployment/v1"
	_ "github.com/corralhq/corral/api/fleet/v1"
	_ "github.com/corralhq/corral/api/hypervisor/v1"
	_ "github.com/corralhq/corral/api/inventory/v1"
	_ "github.com/corralhq/corral/api/node/v1"
	_ "github.com/corralhq/corral/api/osimage/v1"
	_ "github.com/corralhq/corral/api/pool/v1"
	_ "github.com/corralhq/corral/api/provisioning/v1"
	_ "github.com/corralhq/corral/api/store/v1"
	_ "github.com/corralhq/corral/api/webhook/v1"
)

// wantPackages are the proto packages that declare services; the walk
// below fails if one is missing, so a dropped import cannot make it pass.
var wantPackages = []string{
	"corral.deployment.v1",
	"corral.fleet.v1",
	"corral.hypervisor.v1",
	"corral.inventory.v1",
	"corral.node.v1",
	"corral.osimage.v1",
	"corral.pool.v1",
	"corral.provisioning.v1",
}

// TestEveryRPCDeclaresAccess keeps "every RPC checks the role" true: each
// method of each corral.* service must carry an access option naming a
// human role, with only machine roles in also, and the interceptor's
// lookup must find it.
func TestEveryRPCDeclaresAccess(t *testing.T) {
	problems, seen, methods := checkAccess(protoregistry.GlobalFiles, "corral.")
	for _, p := range problems {
		t.Error(p)
	}
	for _, p := range wantPackages {
		if !seen[p] {
			t.Errorf("no services found in package %s: is it imported?", p)
		}
	}
	if methods == 0 {
		t.Fatal("no corral.* methods registered")
	}
	t.Logf("%d methods in %d packages declare access", methods, len(seen))
}

// TestCheckAccessCatchesMissingOption shows the walk above would fail for
// a method without the option.
func TestCheckAccessCatchesMissingOption(t *testing.T) {
	problems, _, methods := checkAccess(testFiles(t), "test.")
	want := []string{"/test.bare.v1.Bare/Plain (test/bare.proto): no (corral.auth.v1.access) option"}
	if diff := cmp.Diff(want, problems); diff != "" || methods != 2 {
		t.Errorf("checkAccess over the test registry: %d methods, problems (-want +got):\n%s", methods, diff)
	}
}

// checkAccess walks every service in packages starting with prefix and
// returns what is wrong with their access options, the packages that have
// services, and the number of methods.
func checkAccess(files *protoregistry.Files, prefix string) (problems []string, seen map[string]bool, methods int) {
	human := []authv1.Role{authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_USER, authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN}
	machine := []authv1.Role{authv1.Role_ROLE_NODE, authv1.Role_ROLE_AGENT, authv1.Role_ROLE_APPLIANCE}
	seen = map[string]bool{}
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), prefix) {
			return true
		}
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			seen[string(fd.Package())] = true
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				methods++
				full := "/" + string(sd.FullName()) + "/" + string(md.Name())
				opts, _ := md.Options().(*descriptorpb.MethodOptions)
				if opts == nil || !proto.HasExtension(opts, authv1.E_Access) {
					problems = append(problems, fmt.Sprintf("%s (%s): no (corral.auth.v1.access) option", full, fd.Path()))
					continue
				}
				a := proto.GetExtension(opts, authv1.E_Access).(*authv1.Access)
				if !slices.Contains(human, a.GetRole()) {
					problems = append(problems, fmt.Sprintf("%s (%s): access role %v; want one of %v", full, fd.Path(), a.GetRole(), human))
				}
				for _, r := range a.GetAlso() {
					if !slices.Contains(machine, r) {
						problems = append(problems, fmt.Sprintf("%s (%s): also lists %v; only %v belong there", full, fd.Path(), r, machine))
					}
				}
				if got := lookupAccess(files, full); !got.known || !proto.Equal(got.access, a) {
					problems = append(problems, fmt.Sprintf("lookupAccess(%s) = %+v; want known with %v", full, got, a))
				}
			}
		}
		return true
	})
	return problems, seen, methods
}

func TestLookupAccess(t *testing.T) {
	files := testFiles(t)
	tests := map[string]struct {
		files  *protoregistry.Files
		method string
		want   methodAccess
	}{
		"viewer method": {
			files: protoregistry.GlobalFiles, method: "/corral.pool.v1.NodeService/ListNodes",
			want: methodAccess{known: true, access: &authv1.Access{Role: authv1.Role_ROLE_VIEWER}},
		},
		"method with also": {
			files: protoregistry.GlobalFiles, method: "/corral.pool.v1.NodeService/GetNode",
			want: methodAccess{known: true, access: &authv1.Access{Role: authv1.Role_ROLE_VIEWER, Also: []authv1.Role{authv1.Role_ROLE_NODE}}},
		},
		"method without option": {
			files: files, method: "/test.bare.v1.Bare/Plain",
			want: methodAccess{known: true},
		},
		"option in test file": {
			files: files, method: "/test.bare.v1.Bare/Guarded",
			want: methodAccess{known: true, access: &authv1.Access{Role: authv1.Role_ROLE_OPERATOR}},
		},
		"unknown method":          {files: protoregistry.GlobalFiles, method: "/corral.pool.v1.NodeService/Nope"},
		"unknown service":         {files: protoregistry.GlobalFiles, method: "/corral.pool.v1.Nope/ListNodes"},
		"message, not service":    {files: protoregistry.GlobalFiles, method: "/corral.pool.v1.Node/ListNodes"},
		"no leading slash":        {files: protoregistry.GlobalFiles, method: "corral.pool.v1.NodeService/ListNodes"},
		"extra segment":           {files: protoregistry.GlobalFiles, method: "/corral.pool.v1.NodeService/ListNodes/x"},
		"empty":                   {files: protoregistry.GlobalFiles, method: ""},
		"empty method":            {files: protoregistry.GlobalFiles, method: "/corral.pool.v1.NodeService/"},
		"invalid name":            {files: protoregistry.GlobalFiles, method: "/corral..pool/ListNodes"},
		"service not in registry": {files: files, method: "/corral.pool.v1.NodeService/ListNodes"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := lookupAccess(tc.files, tc.method)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(methodAccess{}), protocmp.Transform()); diff != "" {
				t.Errorf("lookupAccess(%q) (-want +got):\n%s", tc.method, diff)
			}
		})
	}
}

// testFiles is a registry with service test.bare.v1.Bare: Plain carries no
// access option, Guarded needs OPERATOR.
func testFiles(t *testing.T) *protoregistry.Files {
	t.Helper()
	guarded := &descriptorpb.MethodOptions{}
	proto.SetExtension(guarded, authv1.E_Access, &authv1.Access{Role: authv1.Role_ROLE_OPERATOR})
	fdp := &descriptorpb.FileDescriptorProto{
		Name:        proto.String("test/bare.proto"),
		Package:     proto.String("test.bare.v1"),
		Syntax:      proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Empty")}},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Bare"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: proto.String("Plain"), InputType: proto.String(".test.bare.v1.Empty"), OutputType: proto.String(".test.bare.v1.Empty")},
				{Name: proto.String("Guarded"), InputType: proto.String(".test.bare.v1.Empty"), OutputType: proto.String(".test.bare.v1.Empty"), Options: guarded},
			},
		}},
	}
	fd, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		t.Fatalf("build test descriptor: %v", err)
	}
	files := new(protoregistry.Files)
	if err := files.RegisterFile(fd); err != nil {
		t.Fatalf("register test descriptor: %v", err)
	}
	return files
}
