package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/paging"
)

// pageQuery is what one page of a list asks for.
type pageQuery struct {
	token string
	size  int32
	// machines is the machine list's filters, view and order (nil: every
	// machine, SUMMARY view, by name).
	machines *inventoryv1.ListMachinesRequest
	// timeout bounds each page's call (0: none beyond ctx's); a list of
	// many pages is not bounded by one RPC's deadline.
	timeout time.Duration
}

// listPageSize is the page size the CLI asks for: as many as the appliance
// serves in one page of summaries (the FULL view is capped lower by the
// appliance itself).
const listPageSize = 500

// listAll reads every record of k, page after page (at most limit when
// limit > 0).
func (k *kind) listAll(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery, limit int) ([]proto.Message, error) {
	var out []proto.Message
	err := k.each(ctx, cc, q, limit, func(page []proto.Message) error {
		out = append(out, page...)
		return nil
	})
	return out, err
}

// each hands every page of k's list to fn as it arrives, stopping after
// limit records when limit > 0.
func (k *kind) each(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery, limit int, fn func([]proto.Message) error) error {
	if q.size == 0 {
		q.size = listPageSize
		if limit > 0 && limit < listPageSize {
			q.size = int32(limit)
		}
	}
	var page []proto.Message
	// The appliance answers in name order unless asked for another; an
	// older one (or a test's fake) may not: each page is kept in name
	// order then.
	byName := q.machines.GetOrderBy() == ""
	flush := func() error {
		if len(page) == 0 {
			return nil
		}
		if byName {
			sortByName(page)
		}
		err := fn(page)
		page = nil
		return err
	}
	err := paging.All(ctx, limit, func(ctx context.Context, token string) ([]proto.Message, string, error) {
		if err := flush(); err != nil {
			return nil, "", err
		}
		q.token = token
		if q.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, q.timeout)
			defer cancel()
		}
		return k.page(ctx, cc, q)
	}, func(m proto.Message) error {
		page = append(page, m)
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// printList prints the records of k as their pages arrive: a table's
// header once and each page's rows (aligned within the page), a line per
// record for -o name, a JSON array element by element (the bytes
// encodeJSON would write for the whole list). YAML is one document,
// printed once the last page is read.
func (inv *invocation) printList(ctx context.Context, w io.Writer, cc grpc.ClientConnInterface, k *kind, q pageQuery, limit int, output string) error {
	switch output {
	case formatJSON:
		return inv.streamJSON(ctx, w, cc, k, q, limit)
	case formatYAML:
		ms, err := k.listAll(ctx, cc, q, limit)
		if err != nil {
			return inv.callError("list "+k.name+"s", err)
		}
		return printRecords(w, k, ms, true, output)
	}
	total := 0
	err := k.each(ctx, cc, q, limit, func(page []proto.Message) error {
		if output == formatName {
			total += len(page)
			return printRecords(w, k, page, true, output)
		}
		header, rows := k.table(page, output)
		if total > 0 {
			header = nil
		}
		total += len(page)
		return writeErr(writeRows(w, header, rows))
	})
	if err != nil {
		return inv.callError("list "+k.name+"s", err)
	}
	if total == 0 && output != formatName {
		// A header alone reads as a broken command.
		_, err := fmt.Fprintf(w, "No %s.\n", k.plural())
		return writeErr(err)
	}
	return nil
}

// writeRows is writeTable without the header when header is nil.
func writeRows(w io.Writer, header []string, rows [][]string) error {
	if header != nil {
		return writeTable(w, header, rows)
	}
	if len(rows) == 0 {
		return nil
	}
	// Align the page as writeTable would, then drop its header line.
	var b headless
	if err := writeTable(&b, make([]string, len(rows[0])), rows); err != nil {
		return err
	}
	_, err := w.Write(b.body())
	return err
}

// headless collects a table and returns it without its first line.
type headless struct{ buf []byte }

func (h *headless) Write(p []byte) (int, error) { h.buf = append(h.buf, p...); return len(p), nil }

func (h *headless) body() []byte {
	for i, c := range h.buf {
		if c == '\n' {
			return h.buf[i+1:]
		}
	}
	return nil
}

// streamJSON writes k's list as one indented JSON array, each page's
// records as they arrive.
func (inv *invocation) streamJSON(ctx context.Context, w io.Writer, cc grpc.ClientConnInterface, k *kind, q pageQuery, limit int) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	n := 0
	err := k.each(ctx, cc, q, limit, func(page []proto.Message) error {
		for _, m := range page {
			raw, err := protoJSON(m)
			if err != nil {
				return failf("encode %s: %v", k.name, err)
			}
			// As json.MarshalIndent writes a RawMessage: HTML-escaped.
			var esc, b bytes.Buffer
			json.HTMLEscape(&esc, raw)
			if err := json.Indent(&b, esc.Bytes(), "  ", "  "); err != nil {
				return failf("encode %s: %v", k.name, err)
			}
			sep := ",\n  "
			if n == 0 {
				sep = "[\n  "
			}
			// A bufio.Writer keeps its first error: Flush reports it.
			_, _ = bw.WriteString(sep)
			_, _ = bw.Write(b.Bytes())
			n++
		}
		return writeErr(bw.Flush())
	})
	if err != nil {
		_ = bw.Flush() // the call's error is the one to report
		return inv.callError("list "+k.name+"s", err)
	}
	if n == 0 {
		_, _ = bw.WriteString("[]\n")
	} else {
		_, _ = bw.WriteString("\n]\n")
	}
	return writeErr(bw.Flush())
}
