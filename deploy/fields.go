package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// DecodeOptions are the differences between the request decoding of
// `corral apply` and that of `corral do`, which otherwise share one strict
// field check.
type DecodeOptions struct {
	// Size, when set, parses string values of singular uint64 fields
	// named *_bytes ("10GiB"); the byte count replaces the string. Parse
	// leaves it unset: a task's args are the RPC's request as protojson
	// reads it.
	Size func(string) (uint64, error)
}

// decodeRequest decodes obj, a JSON object decoded with UseNumber, into a
// new message of type mt: checkFields first, so an unknown field is named
// with its path, then protojson, whose refusal is phrased by
// explainProtoError.
func decodeRequest(obj map[string]any, mt protoreflect.MessageType, opts DecodeOptions) (proto.Message, error) {
	if err := checkFields(obj, mt.Descriptor(), "", opts); err != nil {
		return nil, err
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	msg := mt.New().Interface()
	if err := protojson.Unmarshal(b, msg); err != nil {
		return nil, errors.New(explainProtoError(obj, mt, err))
	}
	return msg, nil
}

// checkFields reports the first unknown field of obj, at any depth, with
// its path ("nics[0].network_nam") and the valid names at that level.
// Proto and JSON field names are both accepted, like protojson. With
// opts.Size, sizes are replaced by byte counts in obj.
func checkFields(obj map[string]any, md protoreflect.MessageDescriptor, path string, opts DecodeOptions) error {
	for _, key := range sortedKeys(obj) {
		fd := md.Fields().ByName(protoreflect.Name(key))
		if fd == nil {
			fd = md.Fields().ByJSONName(key)
		}
		if fd == nil {
			valid := fieldNames(md)
			return fmt.Errorf("unknown field %q in %s (valid: %s)%s", path+key, md.Name(), strings.Join(valid, ", "), suggest(key, valid))
		}
		v := obj[key]
		switch {
		case fd.IsMap():
			vd := fd.MapValue().Message()
			m, ok := v.(map[string]any)
			if vd == nil || wellKnown(vd) || !ok {
				continue
			}
			for _, mk := range sortedKeys(m) {
				if o, ok := m[mk].(map[string]any); ok {
					if err := checkFields(o, vd, fmt.Sprintf("%s%s[%s].", path, key, mk), opts); err != nil {
						return err
					}
				}
			}
		case fd.Message() != nil && !wellKnown(fd.Message()):
			if fd.IsList() {
				items, _ := v.([]any)
				for i, it := range items {
					if o, ok := it.(map[string]any); ok {
						if err := checkFields(o, fd.Message(), fmt.Sprintf("%s%s[%d].", path, key, i), opts); err != nil {
							return err
						}
					}
				}
			} else if o, ok := v.(map[string]any); ok {
				if err := checkFields(o, fd.Message(), path+key+".", opts); err != nil {
					return err
				}
			}
		case opts.Size != nil && fd.Kind() == protoreflect.Uint64Kind && !fd.IsList() && strings.HasSuffix(string(fd.Name()), "_bytes"):
			if s, ok := v.(string); ok {
				n, err := opts.Size(s)
				if err != nil {
					return fmt.Errorf("field %q: %v", path+key, err)
				}
				obj[key] = json.Number(strconv.FormatUint(n, 10))
			}
		}
	}
	return nil
}

func fieldNames(md protoreflect.MessageDescriptor) []string {
	fs := md.Fields()
	names := make([]string, 0, fs.Len())
	for i := 0; i < fs.Len(); i++ {
		names = append(names, string(fs.Get(i).Name()))
	}
	return names
}

// wellKnown reports google.protobuf types, which protojson encodes
// specially (timestamps as strings and so on).
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return md.ParentFile() != nil && md.ParentFile().Package() == "google.protobuf"
}

// protoErrorPrefix matches "proto: (line 1:23): ", whose position refers
// to JSON the user never wrote. protobuf-go sometimes puts a non-breaking
// space after "proto:".
var protoErrorPrefix = regexp.MustCompile(`^proto:[\s\x{00a0}]*(\(line \d+:\d+\):[\s\x{00a0}]*)?`)

// explainProtoError names the top-level field whose value protojson
// refused, as written in the file.
func explainProtoError(obj map[string]any, mt protoreflect.MessageType, err error) string {
	for _, key := range sortedKeys(obj) {
		b, merr := json.Marshal(map[string]any{key: obj[key]})
		if merr != nil {
			continue
		}
		if ferr := protojson.Unmarshal(b, mt.New().Interface()); ferr != nil {
			fd := mt.Descriptor().Fields().ByName(protoreflect.Name(key))
			if fd == nil {
				fd = mt.Descriptor().Fields().ByJSONName(key)
			}
			if fd != nil {
				if want, got := fieldType(fd), valueType(obj[key]); want != got.kind {
					return fmt.Sprintf("field %q: want %s, got %s", key, want, got.text)
				}
			}
			return fmt.Sprintf("field %q: %s", key, protoErrorPrefix.ReplaceAllString(ferr.Error(), ""))
		}
	}
	return protoErrorPrefix.ReplaceAllString(err.Error(), "")
}

// fieldType names what a field takes in a file: "a string", "a list of
// strings", "a mapping", "an integer", ...
func fieldType(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsMap():
		return "a mapping"
	case fd.IsList():
		return "a list"
	}
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.EnumKind:
		return "a string"
	case protoreflect.BoolKind:
		return "true or false"
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if wellKnown(fd.Message()) {
			return "a string"
		}
		return "a mapping"
	default: // the integer and floating-point kinds
		return "a number"
	}
}

// written is a value as the file wrote it: its kind (as fieldType names
// kinds) and a description quoting it.
type written struct{ kind, text string }

func valueType(v any) written {
	switch v := v.(type) {
	case []any:
		return written{"a list", "a list"}
	case map[string]any:
		return written{"a mapping", "a mapping"}
	case string:
		return written{"a string", fmt.Sprintf("the string %q", v)}
	case bool:
		return written{"true or false", fmt.Sprintf("%t", v)}
	case nil:
		return written{"null", "null"}
	}
	return written{"a number", fmt.Sprintf("the number %v", v)}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
