package deploy

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"unicode"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	// The API packages register their descriptors and Go types in
	// protoregistry.GlobalFiles and GlobalTypes; the catalog is built from
	// those registries, so every service linked here is reachable.
	_ "github.com/corralhq/corral/api/deployment/v1"
	_ "github.com/corralhq/corral/api/hypervisor/v1"
	_ "github.com/corralhq/corral/api/inventory/v1"
	_ "github.com/corralhq/corral/api/node/v1"
	_ "github.com/corralhq/corral/api/pool/v1"
	_ "github.com/corralhq/corral/api/provisioning/v1"
)

// Method is one unary RPC a task can call.
type Method struct {
	// Type is the task type that reaches it ("VirtualMachine").
	Type string
	// Path is the gRPC method path, "/corral.provisioning.v1.VirtualMachineService/CreateVirtualMachine".
	Path string
	// Input and Output are the request and response message types.
	Input, Output protoreflect.MessageType
}

// Catalog resolves a task's type and action to a unary RPC. It is built
// once from service descriptors and is safe for concurrent use.
type Catalog struct {
	types map[string]*service // by accepted type spelling
	names []string            // canonical type names, sorted
	err   map[string]string   // ambiguous spellings → explanation
}

type service struct {
	typ     string // canonical type name: the service name without "Service"
	full    protoreflect.FullName
	methods map[string]protoreflect.MethodDescriptor
	unary   []string // sorted names of unary methods
}

// corralPackage reports whether pkg is one of Corral's versioned API
// packages, corral.<area>.v1.
func corralPackage(pkg protoreflect.FullName) bool {
	parts := strings.Split(string(pkg), ".")
	return len(parts) == 3 && parts[0] == "corral" && parts[2] == "v1"
}

var defaultCatalog = sync.OnceValue(func() *Catalog {
	return NewCatalog(protoregistry.GlobalFiles)
})

// DefaultCatalog is the catalog of every service in a corral.<area>.v1
// package registered in protoregistry.GlobalFiles.
func DefaultCatalog() *Catalog { return defaultCatalog() }

// NewCatalog builds a catalog from the services in corral.<area>.v1
// packages of files. A service named XService is reached with type X (or
// its snake_case spelling x, as n0cli accepted) or with its full name
// corral.area.v1.XService. When two packages define the same service name
// the short type is ambiguous and only the full name works.
func NewCatalog(files *protoregistry.Files) *Catalog {
	c := &Catalog{types: map[string]*service{}, err: map[string]string{}}
	var all []*service
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !corralPackage(fd.Package()) {
			return true
		}
		svcs := fd.Services()
		for i := 0; i < svcs.Len(); i++ {
			sd := svcs.Get(i)
			name := string(sd.Name())
			typ, ok := strings.CutSuffix(name, "Service")
			if !ok || typ == "" {
				typ = name
			}
			s := &service{typ: typ, full: sd.FullName(), methods: map[string]protoreflect.MethodDescriptor{}}
			ms := sd.Methods()
			for j := 0; j < ms.Len(); j++ {
				md := ms.Get(j)
				s.methods[string(md.Name())] = md
				if !md.IsStreamingClient() && !md.IsStreamingServer() {
					s.unary = append(s.unary, string(md.Name()))
				}
			}
			sort.Strings(s.unary)
			all = append(all, s)
		}
		return true
	})
	count := map[string][]string{}
	for _, s := range all {
		count[s.typ] = append(count[s.typ], string(s.full))
	}
	for _, s := range all {
		c.types[string(s.full)] = s
		if len(count[s.typ]) > 1 {
			sort.Strings(count[s.typ])
			msg := fmt.Sprintf("type %q is ambiguous (%s): write the full service name", s.typ, strings.Join(count[s.typ], ", "))
			c.err[s.typ] = msg
			c.err[snake(s.typ)] = msg
			c.names = append(c.names, string(s.full))
			continue
		}
		c.types[s.typ] = s
		c.types[snake(s.typ)] = s
		c.names = append(c.names, s.typ)
	}
	sort.Strings(c.names)
	return c
}

// snake turns "BlockStorage" into "block_storage".
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Types returns the canonical type names, sorted.
func (c *Catalog) Types() []string { return append([]string(nil), c.names...) }

// Actions returns the unary RPC names reachable with typ, sorted, or nil
// for an unknown type.
func (c *Catalog) Actions(typ string) []string {
	s, ok := c.types[typ]
	if !ok {
		return nil
	}
	return append([]string(nil), s.unary...)
}

// Lookup resolves typ and action. Its errors are phrased for the user and
// list the valid choices.
func (c *Catalog) Lookup(typ, action string) (*Method, error) {
	if typ == "" {
		return nil, fmt.Errorf("missing type (valid: %s)", strings.Join(c.names, ", "))
	}
	if msg, ok := c.err[typ]; ok {
		return nil, fmt.Errorf("%s", msg)
	}
	s, ok := c.types[typ]
	if !ok {
		return nil, fmt.Errorf("unknown type %q (valid: %s)", typ, strings.Join(c.names, ", "))
	}
	if action == "" {
		return nil, fmt.Errorf("missing action for type %s (valid: %s)", s.typ, strings.Join(s.unary, ", "))
	}
	md, ok := s.methods[action]
	if !ok {
		return nil, fmt.Errorf("unknown action %q for type %s (valid: %s)", action, s.typ, strings.Join(s.unary, ", "))
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, fmt.Errorf("action %s of type %s is a streaming RPC; do calls unary RPCs only (valid: %s)", action, s.typ, strings.Join(s.unary, ", "))
	}
	return &Method{
		Type:   s.typ,
		Path:   "/" + string(s.full) + "/" + string(md.Name()),
		Input:  messageType(md.Input()),
		Output: messageType(md.Output()),
	}, nil
}

// messageType is the generated Go type of md from
// protoregistry.GlobalTypes, or a dynamic message type when none is linked
// in (the gRPC codec encodes both).
func messageType(md protoreflect.MessageDescriptor) protoreflect.MessageType {
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName()); err == nil {
		return mt
	}
	return dynamicpb.NewMessageType(md)
}
