package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/corralhq/corral/internal/termsafe"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Output formats of -o. wide and name are get's only.
const (
	formatTable = "table"
	formatWide  = "wide"
	formatName  = "name"
	formatJSON  = "json"
	formatYAML  = "yaml"
)

// addOutputFlag registers -o/--output on cmd.
func addOutputFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", formatTable, "output format: table, json or yaml")
}

func checkFormat(f string) error {
	switch f {
	case formatTable, formatJSON, formatYAML:
		return nil
	}
	return usageErrorf("unknown output format %q (valid: table, json, yaml)", f)
}

// addGetOutputFlag registers get's -o/--output, which also knows wide and
// name.
func addGetOutputFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", formatTable, "output format: table, wide (more columns), name (KIND/NAME per line), json or yaml")
}

func checkGetFormat(f string) error {
	switch f {
	case formatTable, formatWide, formatName, formatJSON, formatYAML:
		return nil
	}
	return usageErrorf("unknown output format %q (valid: table, wide, name, json, yaml)", f)
}

// tableOf returns the header and rows of records of kind k in format f
// (wide appends the kind's extra columns).
func (k *kind) table(ms []proto.Message, f string) ([]string, [][]string) {
	header := k.columns
	if f == formatWide && len(k.wide) > 0 {
		header = append(append([]string(nil), k.columns...), k.wide...)
	}
	out := make([][]string, len(ms))
	for i, m := range ms {
		out[i] = k.cells(m, f)
	}
	return header, out
}

// cells is the row of one record in format f (table or wide).
func (k *kind) cells(m proto.Message, f string) []string {
	r := k.row(m)
	if f == formatWide && k.wideRow != nil {
		r = append(r, k.wideRow(m)...)
	}
	return r
}

// protoJSON renders m as protojson with proto field names, unpopulated
// fields omitted, indented by two spaces. protojson's own multiline output
// varies its whitespace between runs, so the compact form is re-indented.
func protoJSON(m proto.Message) (json.RawMessage, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}

// encodeJSON returns the indented JSON of one record, or of a list of
// records as a JSON array ("[]" when empty).
func encodeJSON(ms []proto.Message, list bool) ([]byte, error) {
	var v any
	if list {
		arr := make([]json.RawMessage, 0, len(ms))
		for _, m := range ms {
			b, err := protoJSON(m)
			if err != nil {
				return nil, err
			}
			arr = append(arr, b)
		}
		v = arr
	} else {
		b, err := protoJSON(ms[0])
		if err != nil {
			return nil, err
		}
		v = b
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// printRecords writes records of kind k to w in format f. list selects
// list output (a table with any number of rows, a JSON/YAML array) rather
// than a single record (a one-row table, a JSON/YAML object).
func printRecords(w io.Writer, k *kind, ms []proto.Message, list bool, f string) error {
	switch f {
	case formatJSON, formatYAML:
		b, err := encodeJSON(ms, list)
		if err != nil {
			return failf("encode %s: %v", k.name, err)
		}
		if f == formatYAML {
			// The YAML reader refuses the C1 and bidi characters JSON
			// leaves raw: read them as the JSON escapes termsafe writes.
			var esc bytes.Buffer
			_, _ = termsafe.Writer(&esc).Write(b)
			if b, err = yaml.JSONToYAML(esc.Bytes()); err != nil {
				return failf("encode %s: %v", k.name, err)
			}
		}
		_, err = w.Write(b)
		return writeErr(err)
	case formatName:
		var b strings.Builder
		for _, m := range ms {
			fmt.Fprintf(&b, "%s/%s\n", k.name, recordName(m))
		}
		_, err := io.WriteString(w, b.String())
		return writeErr(err)
	default:
		if list && len(ms) == 0 {
			// A header alone reads as a broken command.
			_, err := fmt.Fprintf(w, "No %s.\n", k.plural())
			return writeErr(err)
		}
		header, rows := k.table(ms, f)
		return writeErr(writeTable(w, header, rows))
	}
}

// writeList is writeTable for a list of what ("tokens"): an empty list
// says "No tokens." instead of a header alone.
func writeList(w io.Writer, what string, header []string, rows [][]string) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintf(w, "No %s.\n", what)
		return err
	}
	return writeTable(w, header, rows)
}

// writeTable aligns header and rows into columns separated by three
// spaces. Cells never contain tabs or newlines, and their control
// characters are escaped before the columns are measured
// (internal/termsafe; App.stdout escapes them anyway).
func writeTable(w io.Writer, header []string, rows [][]string) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 8, 3, ' ', 0)
	clean := strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")
	for _, r := range append([][]string{header}, rows...) {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = termsafe.Escape(clean.Replace(c))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

func writeErr(err error) error {
	if err != nil {
		return failf("write output: %v", err)
	}
	return nil
}
