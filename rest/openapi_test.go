package rest

import (
	"encoding/json"
	"regexp"
	"sort"
	"strings"
	"testing"

	_ "github.com/corralhq/corral/api/admin/v1"
	_ "github.com/corralhq/corral/api/audit/v1"
	_ "github.com/corralhq/corral/api/auth/v1"
	_ "github.com/corralhq/corral/api/console/v1"
	_ "github.com/corralhq/corral/api/deployment/v1"
	_ "github.com/corralhq/corral/api/fleet/v1"
	_ "github.com/corralhq/corral/api/hypervisor/v1"
	_ "github.com/corralhq/corral/api/inventory/v1"
	_ "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/api/openapi"
	_ "github.com/corralhq/corral/api/osimage/v1"
	_ "github.com/corralhq/corral/api/pool/v1"
	_ "github.com/corralhq/corral/api/provisioning/v1"
	_ "github.com/corralhq/corral/api/webhook/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// TestOpenAPIMatchesProtos: the checked-in document parses, names the
// Bearer security, and lists exactly the annotated RPCs of the protos
// (operation id, method and path); the agent's, the fleet peers' and the
// consoles' RPCs have no REST rule.
func TestOpenAPIMatchesProtos(t *testing.T) {
	var doc struct {
		Swagger             string
		SecurityDefinitions map[string]struct{ Type, In, Name string }
		Paths               map[string]map[string]struct {
			OperationID string `json:"operationId"`
		}
	}
	if err := json.Unmarshal(openapi.JSON, &doc); err != nil {
		t.Fatalf("api/openapi/corral.swagger.json: %v", err)
	}
	if doc.Swagger != "2.0" || doc.SecurityDefinitions["Bearer"].Name != "Authorization" {
		t.Errorf("swagger %q, security %+v", doc.Swagger, doc.SecurityDefinitions)
	}
	var inDoc []string
	for path, ops := range doc.Paths {
		for verb, op := range ops {
			inDoc = append(inDoc, op.OperationID+" "+strings.ToUpper(verb)+" "+vars.ReplaceAllString(path, "{}"))
		}
	}
	var inProtos []string
	unannotated := map[string]bool{"corral.node.v1": true, "corral.fleet.v1": true, "corral.console.v1": true}
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(fd.Path(), "api/") {
			return true
		}
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
				if rule == nil {
					continue
				}
				if unannotated[string(fd.Package())] {
					t.Errorf("%s has a REST rule", md.FullName())
				}
				verb, path := "GET", rule.GetGet()
				switch {
				case rule.GetPost() != "":
					verb, path = "POST", rule.GetPost()
				case rule.GetPut() != "":
					verb, path = "PUT", rule.GetPut()
				case rule.GetPatch() != "":
					verb, path = "PATCH", rule.GetPatch()
				case rule.GetDelete() != "":
					verb, path = "DELETE", rule.GetDelete()
				}
				inProtos = append(inProtos, string(sd.Name())+"_"+string(md.Name())+" "+verb+" "+vars.ReplaceAllString(path, "{}"))
			}
		}
		return true
	})
	sort.Strings(inDoc)
	sort.Strings(inProtos)
	if len(inProtos) < 80 {
		t.Errorf("only %d annotated RPCs", len(inProtos))
	}
	if diff := cmp.Diff(inProtos, inDoc); diff != "" {
		t.Errorf("OpenAPI document vs protos (-protos +document):\n%s", diff)
	}
}

// vars matches a path variable: the document names it in lowerCamel
// (nodeName), the rule as the field (node_name); the URL is the same.
var vars = regexp.MustCompile(`\{[^}]*\}`)

func TestAcceptsSSE(t *testing.T) {
	for accept, want := range map[string]bool{
		"":                  false,
		"application/json":  false,
		"text/event-stream": true,
		"application/json, text/event-stream;q=0.9": true,
		"TEXT/EVENT-STREAM":                         true,
	} {
		r := httptestRequest(accept)
		if got := acceptsSSE(r); got != want {
			t.Errorf("Accept %q: %v, want %v", accept, got, want)
		}
	}
}
