package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"sigs.k8s.io/yaml"
)

func (inv *invocation) applyCommand() *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "apply -f FILE [-f FILE...]",
		Short: "Create or update resources from YAML documents",
		Long: `apply reads one or more YAML documents separated by '---' (-f - reads stdin).
Each document has "kind:" plus the fields of the request for that kind, with
proto field names:

  node            ApplyNodeRequest
  network         ApplyNetworkRequest
  image           ApplyImageRequest
  block_storage   FetchBlockStorageRequest when source_url is set,
                  else CreateBlockStorageRequest
  virtual_machine CreateVirtualMachineRequest

Fields ending in _bytes also accept sizes such as 10GiB or 512M.

Every document of every file is checked before any request is sent, so a file
with an error (exit 2) changes nothing. Documents are then applied in order,
printing "<kind>/<name> applied" for each; the first API error stops the run
(exit 1).`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(files) == 0 {
				return usageErrorf("apply needs -f FILE (or -f - for stdin)")
			}
			var docs []applyDoc
			stdinUsed := false
			for _, f := range files {
				if f == "-" {
					if stdinUsed {
						return usageErrorf("-f - given more than once")
					}
					stdinUsed = true
				}
				data, err := readInput(cmd.InOrStdin(), f)
				if err != nil {
					return err
				}
				d, err := decodeDocuments(inputName(f), data)
				if err != nil {
					return err
				}
				docs = append(docs, d...)
			}
			if len(docs) == 0 {
				return usageErrorf("no documents in %s", strings.Join(files, ", "))
			}

			cc, err := inv.connect(cmd.Flags())
			if err != nil {
				return err
			}
			for _, d := range docs {
				ctx, cancel := inv.callContext(cmd)
				err := d.kind.send(ctx, cc, d.req)
				cancel()
				if err != nil {
					return inv.callError(d.label+": "+d.kind.subject(d.name), err)
				}
				if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s/%s applied\n", d.kind.name, d.name); err != nil {
					return writeErr(err)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "YAML file to apply, - for stdin (repeatable)")
	return cmd
}

func inputName(f string) string {
	if f == "-" {
		return "stdin"
	}
	return f
}

// maxInput bounds what apply reads from one file or stdin.
const maxInput = 16 << 20

func readInput(stdin io.Reader, f string) ([]byte, error) {
	var r io.Reader
	if f == "-" {
		r = stdin
	} else {
		fh, err := os.Open(f)
		if err != nil {
			return nil, failf("%v", err)
		}
		defer fh.Close()
		r = fh
	}
	data, err := io.ReadAll(io.LimitReader(r, maxInput+1))
	if err != nil {
		return nil, failf("read %s: %v", inputName(f), err)
	}
	if len(data) > maxInput {
		return nil, usageErrorf("%s: larger than %d MiB", inputName(f), maxInput>>20)
	}
	return data, nil
}

// applyDoc is one decoded, validated document.
type applyDoc struct {
	label string // "file.yaml: document 2 (line 7)"
	kind  *kind
	name  string
	req   proto.Message
}

// rawDoc is one YAML document of a stream and the line it starts on.
type rawDoc struct {
	line int
	text []byte
}

// splitDocuments splits a YAML stream at lines that are "---" alone
// (optionally followed by spaces or a comment).
func splitDocuments(data []byte) []rawDoc {
	var docs []rawDoc
	cur := rawDoc{line: 1}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), maxInput+1)
	sc.Split(scanLinesKeepEOL)
	line := 0
	for sc.Scan() {
		line++
		l := sc.Bytes()
		if rest, ok := bytes.CutPrefix(l, []byte("---")); ok {
			if t := bytes.TrimSpace(rest); len(t) == 0 || t[0] == '#' {
				docs = append(docs, cur)
				cur = rawDoc{line: line + 1}
				continue
			}
		}
		cur.text = append(cur.text, l...)
	}
	return append(docs, cur)
}

// scanLinesKeepEOL is bufio.ScanLines without dropping the line ends, so
// documents keep their exact text.
func scanLinesKeepEOL(data []byte, atEOF bool) (int, []byte, error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i+1], nil
	}
	if atEOF {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// decodeDocuments decodes and validates every document of one input.
// Empty documents (only comments or blanks) are skipped and not counted.
func decodeDocuments(source string, data []byte) ([]applyDoc, error) {
	var out []applyDoc
	n := 0
	for _, raw := range splitDocuments(data) {
		label := fmt.Sprintf("%s: document %d (line %d)", source, n+1, raw.line)
		doc, empty, err := decodeDocument(raw.text)
		if err != nil {
			return nil, usageErrorf("%s: %v", label, err)
		}
		if empty {
			continue
		}
		n++
		doc.label = label
		out = append(out, doc)
	}
	return out, nil
}

// decodeDocument turns one YAML document into the request of its kind.
// Unknown fields, at any depth, are errors naming the field.
func decodeDocument(text []byte) (doc applyDoc, empty bool, err error) {
	j, err := yaml.YAMLToJSONStrict(text)
	if err != nil {
		return doc, false, fmt.Errorf("invalid YAML: %v", err)
	}
	if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" {
		return doc, true, nil
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return doc, false, fmt.Errorf("invalid document: %v", err)
	}
	fields, ok := v.(map[string]any)
	if !ok {
		return doc, false, fmt.Errorf("document is not a mapping of fields")
	}

	kv, ok := fields["kind"]
	if !ok {
		return doc, false, fmt.Errorf("missing kind (valid: %s)", applyKindList())
	}
	ks, ok := kv.(string)
	if !ok {
		return doc, false, fmt.Errorf("kind must be a string")
	}
	k, ok := lookupKind(ks)
	if !ok {
		return doc, false, fmt.Errorf("unknown kind %q (valid: %s)", ks, applyKindList())
	}
	if k.request == nil {
		return doc, false, fmt.Errorf("kind %s cannot be applied (valid: %s)", k.name, applyKindList())
	}
	delete(fields, "kind")

	req := k.request(fields)
	md := req.ProtoReflect().Descriptor()
	if err := checkFields(fields, md, ""); err != nil {
		return doc, false, fmt.Errorf("%v in %s (%s)", err, k.name, md.Name())
	}
	b, err := json.Marshal(fields)
	if err != nil {
		return doc, false, err
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(b, req); err != nil {
		return doc, false, fmt.Errorf("%s in %s (%s)", explainProtoError(fields, req, err), k.name, md.Name())
	}
	name := recordName(req)
	if name == "" {
		return doc, false, fmt.Errorf("%s: name is required", k.name)
	}
	return applyDoc{kind: k, name: name, req: req}, false, nil
}

// checkFields walks a decoded JSON object against the message it will be
// unmarshalled into and reports the first unknown field with its path
// (e.g. "nics[0].network_nam"). Fields accept proto or JSON names, like
// protojson. String values of uint64 fields named *_bytes are parsed as
// sizes (10GiB) and replaced by the byte count.
func checkFields(obj map[string]any, md protoreflect.MessageDescriptor, path string) error {
	keys := make([]string, 0, len(obj))
	for key := range obj {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		fd := md.Fields().ByName(protoreflect.Name(key))
		if fd == nil {
			fd = md.Fields().ByJSONName(key)
		}
		if fd == nil {
			return fmt.Errorf("unknown field %q", path+key)
		}
		v := obj[key]
		switch {
		case fd.IsMap():
			vd := fd.MapValue().Message()
			m, ok := v.(map[string]any)
			if vd == nil || isWellKnown(vd) || !ok {
				continue
			}
			for _, mk := range sortedKeys(m) {
				if o, ok := m[mk].(map[string]any); ok {
					if err := checkFields(o, vd, fmt.Sprintf("%s%s[%s].", path, key, mk)); err != nil {
						return err
					}
				}
			}
		case fd.Message() != nil && !isWellKnown(fd.Message()):
			if fd.IsList() {
				items, _ := v.([]any)
				for i, it := range items {
					if o, ok := it.(map[string]any); ok {
						if err := checkFields(o, fd.Message(), fmt.Sprintf("%s%s[%d].", path, key, i)); err != nil {
							return err
						}
					}
				}
			} else if o, ok := v.(map[string]any); ok {
				if err := checkFields(o, fd.Message(), path+key+"."); err != nil {
					return err
				}
			}
		case fd.Kind() == protoreflect.Uint64Kind && !fd.IsList() && strings.HasSuffix(string(fd.Name()), "_bytes"):
			if s, ok := v.(string); ok {
				n, err := parseSize(s)
				if err != nil {
					return fmt.Errorf("field %q: %v", path+key, err)
				}
				obj[key] = json.Number(strconv.FormatUint(n, 10))
			}
		}
	}
	return nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// isWellKnown reports google.protobuf types, which protojson encodes
// specially (timestamps as strings and so on).
func isWellKnown(md protoreflect.MessageDescriptor) bool {
	return md.ParentFile() != nil && md.ParentFile().Package() == "google.protobuf"
}

// protoErrorPrefix matches "proto: (line 1:23): ", whose position refers
// to JSON the user never saw. protobuf-go sometimes uses a non-breaking
// space after "proto:".
var protoErrorPrefix = regexp.MustCompile(`^proto:[\s\x{00a0}]*(\(line \d+:\d+\):[\s\x{00a0}]*)?`)

func cleanProtoError(err error) string {
	return protoErrorPrefix.ReplaceAllString(err.Error(), "")
}

// explainProtoError phrases err, from unmarshalling fields into a message
// of req's type, for the user: it finds the top-level field whose value
// was refused and names it as written in the file.
func explainProtoError(fields map[string]any, req proto.Message, err error) string {
	for _, key := range sortedKeys(fields) {
		b, merr := json.Marshal(map[string]any{key: fields[key]})
		if merr != nil {
			continue
		}
		probe := req.ProtoReflect().New().Interface()
		if ferr := protojson.Unmarshal(b, probe); ferr != nil {
			return fmt.Sprintf("field %q: %s", key, cleanProtoError(ferr))
		}
	}
	return cleanProtoError(err)
}

// applyKindList names the kinds apply accepts.
func applyKindList() string {
	var names []string
	for _, k := range kinds {
		if k.request != nil {
			names = append(names, k.name)
		}
	}
	return strings.Join(names, ", ")
}
