package deploy

import (
	"errors"
	"fmt"
	"maps"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Kind is a resource kind as apply documents ("kind: virtual_machine") and
// the command line (`corral get vm`) name it. A kind is served by one
// registry type; an appliable kind names the action its documents are
// sent to.
type Kind struct {
	// Name is the canonical name, printed in "<kind>/<name>".
	Name string
	// Aliases are other accepted names. Names and aliases match with
	// case, '-' and '_' folded: "VirtualMachine" and "virtual-machine"
	// are virtual_machine.
	Aliases []string
	// Type is the registry type whose service serves the kind
	// ("VirtualMachine").
	Type string
	// Apply is the action of Type a document of the kind is sent to; ""
	// when the kind cannot be applied.
	Apply string
	// ApplyIf lists actions that replace Apply for a document that sets
	// a given field of their request; the first match wins.
	ApplyIf []FieldAction

	apply   *Method       // resolved Apply
	applyIf []fieldAction // resolved ApplyIf
}

// FieldAction sends a document that sets Field to Action instead of
// Kind.Apply.
type FieldAction struct {
	// Field is a proto field name of Action's request; its JSON name
	// matches too.
	Field  string
	Action string
}

type fieldAction struct {
	names  []string // proto and JSON name of the field
	method *Method
}

// DefaultKinds returns the kinds of Corral's resources, in the order
// messages list them. Each call returns a new slice.
func DefaultKinds() []Kind {
	return []Kind{
		{Name: "node", Aliases: []string{"nodes"}, Type: "Node", Apply: "ApplyNode"},
		{Name: "network", Aliases: []string{"networks", "net"}, Type: "Network", Apply: "ApplyNetwork"},
		{Name: "virtual_machine", Aliases: []string{"vm", "vms", "virtual_machines"}, Type: "VirtualMachine", Apply: "CreateVirtualMachine"},
		{
			Name: "block_storage", Aliases: []string{"bs", "block_storages"}, Type: "BlockStorage",
			// A document with source_url downloads the volume; without,
			// it creates an empty one.
			Apply:   "CreateBlockStorage",
			ApplyIf: []FieldAction{{Field: "source_url", Action: "FetchBlockStorage"}},
		},
		{Name: "image", Aliases: []string{"images"}, Type: "Image", Apply: "ApplyImage"},
		// Operating-system images, a kind apart from n0stack's images:
		// applying one registers it (again with the same URL, hash and
		// format: no change).
		{Name: "os_image", Aliases: []string{"os_images"}, Type: "OSImage", Apply: "RegisterOSImage"},
		// Machines are discovered or enrolled, never applied.
		{Name: "machine", Aliases: []string{"machines"}, Type: "Machine"},
	}
}

// foldName folds case, spaces around, '-' and '_', so that
// "virtual_machine", "VirtualMachine" and "virtual-machine" are the same
// name.
func foldName(s string) string {
	return strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(strings.TrimSpace(s)))
}

// addKinds resolves and adds kinds; see NewRegistry.
func (r *Registry) addKinds(kinds []Kind) error {
	seen := map[string]string{}
	for _, k := range kinds {
		if k.Name == "" {
			return fmt.Errorf("kind of type %q has no name", k.Type)
		}
		for _, n := range append([]string{k.Name}, k.Aliases...) {
			f := foldName(n)
			if other, dup := seen[f]; dup {
				return fmt.Errorf("kind %s: name %q is already taken by kind %s", k.Name, n, other)
			}
			seen[f] = k.Name
		}
		if _, ok := r.types[k.Type]; !ok {
			_, err := r.Lookup(k.Type, "") // the unknown or ambiguous type, phrased
			return fmt.Errorf("kind %s: %v", k.Name, err)
		}
		k.Aliases = append([]string(nil), k.Aliases...)
		k.ApplyIf = append([]FieldAction(nil), k.ApplyIf...)
		if k.Apply == "" && len(k.ApplyIf) > 0 {
			return fmt.Errorf("kind %s: ApplyIf without Apply", k.Name)
		}
		if k.Apply != "" {
			m, err := r.Lookup(k.Type, k.Apply)
			if err != nil {
				return fmt.Errorf("kind %s: %v", k.Name, err)
			}
			k.apply = m
		}
		for _, fa := range k.ApplyIf {
			m, err := r.Lookup(k.Type, fa.Action)
			if err != nil {
				return fmt.Errorf("kind %s: %v", k.Name, err)
			}
			fd := m.Input.Descriptor().Fields().ByName(protoreflect.Name(fa.Field))
			if fd == nil {
				return fmt.Errorf("kind %s: %s has no field %q", k.Name, m.Input.Descriptor().Name(), fa.Field)
			}
			k.applyIf = append(k.applyIf, fieldAction{names: []string{string(fd.Name()), fd.JSONName()}, method: m})
		}
		r.kinds = append(r.kinds, &k)
	}
	return nil
}

// Kinds returns the registry's kinds in order. They must not be modified.
func (r *Registry) Kinds() []*Kind { return append([]*Kind(nil), r.kinds...) }

// Kind resolves a kind name or alias (case, '-' and '_' folded).
func (r *Registry) Kind(name string) (*Kind, bool) {
	n := foldName(name)
	if n == "" {
		return nil, false
	}
	for _, k := range r.kinds {
		if foldName(k.Name) == n {
			return k, true
		}
		for _, a := range k.Aliases {
			if foldName(a) == n {
				return k, true
			}
		}
	}
	return nil, false
}

// appliable names the kinds that can be applied, for messages.
func (r *Registry) appliable() string {
	var names []string
	for _, k := range r.kinds {
		if k.apply != nil {
			names = append(names, k.Name)
		}
	}
	return strings.Join(names, ", ")
}

// Document is one decoded apply document.
type Document struct {
	Kind *Kind
	// Method is the RPC the document is sent to, chosen by the kind.
	Method  *Method
	Request proto.Message
}

// Document decodes an apply document: a JSON object, decoded with
// json.Decoder.UseNumber, with "kind" plus the fields of the request of
// the kind's apply action. Unknown fields at any depth are refused like
// Parse refuses them in a task's args. Document may rewrite values of
// fields (see DecodeOptions). Its errors are phrased for the user and
// name the kind, the action and the field.
func (r *Registry) Document(fields map[string]any, opts DecodeOptions) (*Document, error) {
	kv, ok := fields["kind"]
	if !ok {
		return nil, fmt.Errorf("missing kind (valid: %s)", r.appliable())
	}
	ks, ok := kv.(string)
	if !ok {
		return nil, errors.New("kind must be a string")
	}
	k, ok := r.Kind(ks)
	if !ok {
		return nil, fmt.Errorf("unknown kind %q (valid: %s)", ks, r.appliable())
	}
	if k.apply == nil {
		return nil, fmt.Errorf("kind %s cannot be applied (valid: %s)", k.Name, r.appliable())
	}
	fields = maps.Clone(fields)
	delete(fields, "kind")
	m := k.method(fields)
	req, err := decodeRequest(fields, m.Input, opts)
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w", k.Name, m.Input.Descriptor().Name(), err)
	}
	return &Document{Kind: k, Method: m, Request: req}, nil
}

// method chooses the apply action for a document's fields.
func (k *Kind) method(fields map[string]any) *Method {
	for _, fa := range k.applyIf {
		for _, n := range fa.names {
			if _, ok := fields[n]; ok {
				return fa.method
			}
		}
	}
	return k.apply
}

// ApplyRequests describes what a document of k is decoded into, for help
// texts: "CreateBlockStorageRequest; FetchBlockStorageRequest when
// source_url is set". It is "" when k cannot be applied.
func (k *Kind) ApplyRequests() string {
	if k.apply == nil {
		return ""
	}
	parts := []string{string(k.apply.Input.Descriptor().Name())}
	for _, fa := range k.applyIf {
		parts = append(parts, fmt.Sprintf("%s when %s is set", fa.method.Input.Descriptor().Name(), fa.names[0]))
	}
	return strings.Join(parts, "; ")
}
