package rest

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// route is one google.api.http rule of a registered method.
type route struct {
	verb   string   // HTTP method
	segs   []string // literal segments, or "{field}"
	custom string   // ":verb" suffix of the last segment, or ""
	body   string   // the rule's body: "", "*" or a field
	method string   // "/corral.inventory.v1.MachineService/WatchMachines"
	input  protoreflect.MessageType
	stream bool // server-streaming (a watch)
}

// routes reads the rules of srv's methods from the descriptors the
// generated code registered.
func routes(srv *grpc.Server) ([]route, error) {
	var rs []route
	for name := range srv.GetServiceInfo() {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			continue // a service without registered descriptors has no rules
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			continue
		}
		for i := range sd.Methods().Len() {
			md := sd.Methods().Get(i)
			rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
			if rule == nil || md.IsStreamingClient() {
				continue
			}
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
			if err != nil {
				return nil, fmt.Errorf("rest: %s: %w", md.FullName(), err)
			}
			for _, b := range append([]*annotations.HttpRule{rule}, rule.GetAdditionalBindings()...) {
				verb, path := http.MethodGet, b.GetGet()
				switch {
				case b.GetPost() != "":
					verb, path = http.MethodPost, b.GetPost()
				case b.GetPut() != "":
					verb, path = http.MethodPut, b.GetPut()
				case b.GetPatch() != "":
					verb, path = http.MethodPatch, b.GetPatch()
				case b.GetDelete() != "":
					verb, path = http.MethodDelete, b.GetDelete()
				}
				if path == "" {
					continue
				}
				rt := route{verb: verb, body: b.GetBody(), method: "/" + string(sd.FullName()) + "/" + string(md.Name()), input: mt, stream: md.IsStreamingServer()}
				rt.segs, rt.custom = split(path)
				rs = append(rs, rt)
			}
		}
	}
	return rs, nil
}

// split cuts a path into segments and its custom verb.
func split(path string) ([]string, string) {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	last := segs[len(segs)-1]
	if i := strings.LastIndexByte(last, ':'); i >= 0 && !strings.HasSuffix(last, "}") {
		segs[len(segs)-1] = last[:i]
		return segs, last[i:]
	}
	return segs, ""
}

// match returns the route for verb and path and its path variables.
func (h *Handler) match(verb, path string) (route, map[string]string, bool) {
	segs, custom := split(path)
	for _, rt := range h.routes {
		if rt.verb != verb || rt.custom != custom || len(rt.segs) != len(segs) {
			continue
		}
		vars := map[string]string{}
		ok := true
		for i, s := range rt.segs {
			if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
				v, err := url.PathUnescape(segs[i])
				if err != nil || v == "" {
					ok = false
					break
				}
				vars[s[1:len(s)-1]] = v
			} else if s != segs[i] {
				ok = false
				break
			}
		}
		if ok {
			return rt, vars, true
		}
	}
	return route{}, nil, false
}

// field finds a field by JSON or proto name.
func field(md protoreflect.MessageDescriptor, k string) protoreflect.FieldDescriptor {
	if fd := md.Fields().ByJSONName(k); fd != nil {
		return fd
	}
	return md.Fields().ByName(protoreflect.Name(k))
}

// checkInput refuses, as InvalidArgument, a unary request whose query or
// body would not decode into the RPC's request (an unknown field or
// parameter, malformed JSON, a value of the wrong type or an unknown enum
// name), before the transcoder sees it: it would answer those as an
// internal error. A request no rule matches is left to the transcoder.
func (h *Handler) checkInput(r *http.Request, body []byte) error {
	rt, _, ok := h.match(r.Method, r.URL.Path)
	if !ok || rt.stream {
		return nil
	}
	md := rt.input.Descriptor()
	for k, vals := range r.URL.Query() {
		d := md
		var fd protoreflect.FieldDescriptor
		for part := range strings.SplitSeq(k, ".") {
			if d == nil {
				return status.Errorf(codes.InvalidArgument, "unknown query parameter %.64q", k)
			}
			if fd = field(d, part); fd == nil {
				return status.Errorf(codes.InvalidArgument, "unknown query parameter %.64q", k)
			}
			d = fd.Message()
		}
		if d != nil || fd.IsMap() {
			continue // the transcoder's to judge
		}
		for _, v := range vals {
			if _, err := scalar(fd, v); err != nil {
				return status.Errorf(codes.InvalidArgument, "%s=%.64q: %v", k, v, err)
			}
		}
	}
	if len(body) == 0 || rt.body == "" {
		return nil
	}
	msg := rt.input.New()
	if rt.body != "*" {
		fd := field(md, rt.body)
		if fd == nil || fd.Message() == nil {
			return nil
		}
		msg = msg.Mutable(fd).Message()
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(body, msg.Interface()); err != nil {
		return status.Errorf(codes.InvalidArgument, "request body: %v", err)
	}
	return nil
}
