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
	// protoregistry.GlobalFiles and GlobalTypes; the registry is built
	// from those, so every service linked here is reachable.
	_ "github.com/corralhq/corral/api/deployment/v1"
	_ "github.com/corralhq/corral/api/hypervisor/v1"
	_ "github.com/corralhq/corral/api/inventory/v1"
	_ "github.com/corralhq/corral/api/node/v1"
	_ "github.com/corralhq/corral/api/osimage/v1"
	_ "github.com/corralhq/corral/api/pool/v1"
	_ "github.com/corralhq/corral/api/provisioning/v1"
)

// Method is one unary RPC a task or an apply document is sent to.
type Method struct {
	// Type is the task type that reaches it ("VirtualMachine").
	Type string
	// Action is the RPC's name ("CreateVirtualMachine").
	Action string
	// Path is the gRPC method path, "/corral.provisioning.v1.VirtualMachineService/CreateVirtualMachine".
	Path string
	// Input and Output are the request and response message types.
	Input, Output protoreflect.MessageType
}

// Registry is the one table of what `corral do` and `corral apply` reach:
// task types and their actions (the services and unary RPCs of the
// corral.<area>.v1 packages, Lookup) and resource kinds (the names apply
// documents and the command line use, each served by one type, Kind).
// Both decode requests with the same strict field check. A Registry is
// built once and is safe for concurrent use.
type Registry struct {
	types map[string]*service // by accepted type spelling
	names []string            // canonical type names, sorted
	err   map[string]string   // ambiguous spellings → explanation

	kinds []*Kind // in the order given to NewRegistry
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

var defaultRegistry = sync.OnceValue(func() *Registry {
	r, err := NewRegistry(protoregistry.GlobalFiles, DefaultKinds()...)
	if err != nil {
		// DefaultKinds is compiled in and checked by the tests.
		panic(err)
	}
	return r
})

// DefaultRegistry is the registry of every service in a corral.<area>.v1
// package registered in protoregistry.GlobalFiles, with DefaultKinds.
func DefaultRegistry() *Registry { return defaultRegistry() }

// NewRegistry builds a registry from the services in corral.<area>.v1
// packages of files and the given kinds. A service named XService is
// reached with type X (or its snake_case spelling x, as n0cli accepted) or
// with its full name corral.area.v1.XService. When two packages define
// the same service name the short type is ambiguous and only the full
// name works.
//
// It returns an error when a kind names a type, action or field the
// services do not have, or when two kinds share a name.
func NewRegistry(files *protoregistry.Files, kinds ...Kind) (*Registry, error) {
	r := &Registry{types: map[string]*service{}, err: map[string]string{}}
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
		r.types[string(s.full)] = s
		if len(count[s.typ]) > 1 {
			sort.Strings(count[s.typ])
			msg := fmt.Sprintf("type %q is ambiguous (%s): write the full service name", s.typ, strings.Join(count[s.typ], ", "))
			r.err[s.typ] = msg
			r.err[snake(s.typ)] = msg
			r.names = append(r.names, string(s.full))
			continue
		}
		r.types[s.typ] = s
		r.types[snake(s.typ)] = s
		r.names = append(r.names, s.typ)
	}
	sort.Strings(r.names)

	if err := r.addKinds(kinds); err != nil {
		return nil, err
	}
	return r, nil
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
func (r *Registry) Types() []string { return append([]string(nil), r.names...) }

// Actions returns the unary RPC names reachable with typ, sorted, or nil
// for an unknown type.
func (r *Registry) Actions(typ string) []string {
	s, ok := r.types[typ]
	if !ok {
		return nil
	}
	return append([]string(nil), s.unary...)
}

// Lookup resolves typ and action. Its errors are phrased for the user and
// list the valid choices.
func (r *Registry) Lookup(typ, action string) (*Method, error) {
	if typ == "" {
		return nil, fmt.Errorf("missing type (valid: %s)", strings.Join(r.names, ", "))
	}
	if msg, ok := r.err[typ]; ok {
		return nil, fmt.Errorf("%s", msg)
	}
	s, ok := r.types[typ]
	if !ok {
		return nil, fmt.Errorf("unknown type %q (valid: %s)", typ, strings.Join(r.names, ", "))
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
		Action: string(md.Name()),
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
