package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/corralhq/corral/deploy"
)

func (inv *invocation) applyCommand() *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "apply -f FILE [-f FILE...]",
		Short: "Create or update resources from YAML documents",
		Long: `apply reads one or more YAML documents separated by '---' (-f - reads stdin).
Each document has "kind:" plus the fields of the request for that kind, with
proto field names:

` + applyKindHelp(deploy.DefaultRegistry()) + `
The kinds, their requests and the check for unknown fields are the ones
"corral do" uses for tasks.

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
				d, err := decodeDocuments(deploy.DefaultRegistry(), inputName(f), data)
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
				err := cc.Invoke(ctx, d.Method.Path, d.Request, d.Method.Output.New().Interface())
				cancel()
				if err != nil {
					return inv.callError(fmt.Sprintf("%s: %s %q", d.label, d.Kind.Name, d.name), err)
				}
				if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s/%s applied\n", d.Kind.Name, d.name); err != nil {
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
			return nil, fileErrorf("-f", err)
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
	*deploy.Document
	label string // "file.yaml: document 2 (line 7)"
	name  string
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
func decodeDocuments(reg *deploy.Registry, source string, data []byte) ([]applyDoc, error) {
	var out []applyDoc
	n := 0
	for _, raw := range splitDocuments(data) {
		label := fmt.Sprintf("%s: document %d (line %d)", source, n+1, raw.line)
		doc, empty, err := decodeDocument(reg, raw.text)
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

// decodeDocument turns one YAML document into the request of its kind,
// through the registry that `corral do` resolves tasks with. Unknown
// fields, at any depth, are errors naming the field.
func decodeDocument(reg *deploy.Registry, text []byte) (doc applyDoc, empty bool, err error) {
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
	d, err := reg.Document(fields, deploy.DecodeOptions{Size: parseSize})
	if err != nil {
		return doc, false, nameObject(reg, fields, err)
	}
	name := recordName(d.Request)
	if name == "" {
		return doc, false, fmt.Errorf("%s: name is required", d.Kind.Name)
	}
	return applyDoc{Document: d, name: name}, false, nil
}

// nameObject puts the object's name into a decoding error of Document,
// which names its kind ("network (ApplyNetworkRequest): field ..."): the
// reader learns which object of the file is wrong, not only which kind.
func nameObject(reg *deploy.Registry, fields map[string]any, err error) error {
	ks, _ := fields["kind"].(string)
	name, _ := fields["name"].(string)
	k, ok := reg.Kind(ks)
	if !ok || name == "" {
		return err
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, k.Name+" ("); ok {
		return fmt.Errorf("%s %q (%s", k.Name, name, rest)
	}
	return fmt.Errorf("%s %q: %s", k.Name, name, msg)
}

// applyKindHelp lists the appliable kinds of reg and their requests, one
// line each, for apply's help.
func applyKindHelp(reg *deploy.Registry) string {
	var b strings.Builder
	for _, k := range reg.Kinds() {
		if reqs := k.ApplyRequests(); reqs != "" {
			fmt.Fprintf(&b, "  %-15s %s\n", k.Name, reqs)
		}
	}
	return b.String()
}
