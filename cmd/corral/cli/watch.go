package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v5"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/internal/termsafe"
)

// watchQuery is what one Watch call asks for.
type watchQuery struct {
	name  string // one record when set
	from  int64  // from_revision (corral.watch.v1)
	state inventoryv1.Machine_MachineState
	// summary asks for machines in the SUMMARY view: tables and names
	// print nothing more (JSON and YAML print whole records).
	summary bool
}

// view is the machine view q asks for.
func (q watchQuery) view() inventoryv1.MachineView {
	if q.summary {
		return inventoryv1.MachineView_MACHINE_VIEW_SUMMARY
	}
	return inventoryv1.MachineView_MACHINE_VIEW_FULL
}

// watchEvent is one event of any Watch stream.
type watchEvent struct {
	typ watchv1.EventType
	rev int64
	obj proto.Message // the record; nil for SYNCED
	raw proto.Message // the event message as received, for -o json|yaml
}

// recvFunc returns the next event of an open stream, or the error that
// ended it (io.EOF when the server closed it without a status).
type recvFunc func() (watchEvent, error)

// nonNil turns a nil record pointer into a nil interface.
func nonNil[T interface {
	comparable
	proto.Message
}](m T) proto.Message {
	var zero T
	if m == zero {
		return nil
	}
	return m
}

// streamRecv adapts a generated client stream to recvFunc.
func streamRecv[E interface {
	proto.Message
	GetType() watchv1.EventType
	GetRevision() int64
}](s interface{ Recv() (E, error) }, obj func(E) proto.Message) recvFunc {
	return func() (watchEvent, error) {
		e, err := s.Recv()
		if err != nil {
			return watchEvent{}, err
		}
		return watchEvent{typ: e.GetType(), rev: e.GetRevision(), obj: obj(e), raw: e}, nil
	}
}

func init() {
	machineKind.watch = func(ctx context.Context, cc grpc.ClientConnInterface, q watchQuery) (recvFunc, error) {
		s, err := inventoryv1.NewMachineServiceClient(cc).WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{Name: q.name, FromRevision: q.from, State: q.state, View: q.view()})
		if err != nil {
			return nil, err
		}
		return streamRecv(s, func(e *inventoryv1.MachineEvent) proto.Message { return nonNil(e.GetMachine()) }), nil
	}
	nodeKind.watch = func(ctx context.Context, cc grpc.ClientConnInterface, q watchQuery) (recvFunc, error) {
		s, err := poolv1.NewNodeServiceClient(cc).WatchNodes(ctx, &poolv1.WatchNodesRequest{Name: q.name, FromRevision: q.from})
		if err != nil {
			return nil, err
		}
		return streamRecv(s, func(e *poolv1.NodeEvent) proto.Message { return nonNil(e.GetNode()) }), nil
	}
	networkKind.watch = func(ctx context.Context, cc grpc.ClientConnInterface, q watchQuery) (recvFunc, error) {
		s, err := poolv1.NewNetworkServiceClient(cc).WatchNetworks(ctx, &poolv1.WatchNetworksRequest{Name: q.name, FromRevision: q.from})
		if err != nil {
			return nil, err
		}
		return streamRecv(s, func(e *poolv1.NetworkEvent) proto.Message { return nonNil(e.GetNetwork()) }), nil
	}
	blockStorageKind.watch = func(ctx context.Context, cc grpc.ClientConnInterface, q watchQuery) (recvFunc, error) {
		s, err := provisioningv1.NewBlockStorageServiceClient(cc).WatchBlockStorages(ctx, &provisioningv1.WatchBlockStoragesRequest{Name: q.name, FromRevision: q.from})
		if err != nil {
			return nil, err
		}
		return streamRecv(s, func(e *provisioningv1.BlockStorageEvent) proto.Message { return nonNil(e.GetBlockStorage()) }), nil
	}
	virtualMachineKind.watch = func(ctx context.Context, cc grpc.ClientConnInterface, q watchQuery) (recvFunc, error) {
		s, err := provisioningv1.NewVirtualMachineServiceClient(cc).WatchVirtualMachines(ctx, &provisioningv1.WatchVirtualMachinesRequest{Name: q.name, FromRevision: q.from})
		if err != nil {
			return nil, err
		}
		return streamRecv(s, func(e *provisioningv1.VirtualMachineEvent) proto.Message { return nonNil(e.GetVirtualMachine()) }), nil
	}
}

// Resuming a cut watch: the first retry is immediate (a watcher cut for
// being slow, or a server restart behind a load balancer), later ones back
// off up to watchMaxBackoff while the stream keeps failing without an
// event.
var (
	watchFirstBackoff = 200 * time.Millisecond
	watchMaxBackoff   = 5 * time.Second
)

// watchOpen opens a Watch stream from a revision.
type watchOpen func(ctx context.Context, from int64) (recvFunc, error)

// runWatch follows a Watch stream until ctx ends (then it returns nil: a
// Ctrl-C is a normal end), printing every event with p. The stream is
// reopened when it ends: after RESOURCE_EXHAUSTED (cut as a slow watcher),
// UNAVAILABLE or a plain end from the last revision seen; after
// OUT_OF_RANGE (that revision is compacted) from revision 0, a fresh list,
// saying so on stderr. A stream cut during its initial list is listed
// again. Any other status ends the watch with an error about subject, as
// does an appliance that cannot be reached before the first event.
func (inv *invocation) runWatch(ctx context.Context, subject string, open watchOpen, p *eventPrinter) error {
	var from int64
	received := false // any event ever: the appliance is reachable
	fails := 0
	// No jitter: one operator's watch, not a fleet reconnecting at once.
	pause := backoff.ExponentialBackOff{InitialInterval: watchFirstBackoff, Multiplier: 2, MaxInterval: watchMaxBackoff}
	for {
		listing := from == 0
		if listing {
			p.relist()
		}
		recv, err := open(ctx, from)
		if err == nil {
			for {
				var ev watchEvent
				if ev, err = recv(); err != nil {
					break
				}
				received = true
				if fails > 0 {
					fails = 0
					pause.Reset()
				}
				switch {
				case ev.typ == watchv1.EventType_SYNCED:
					listing = false
					from = max(from, ev.rev)
				case !listing:
					from = max(from, ev.rev)
				}
				if err := p.event(ev); err != nil {
					return err
				}
			}
		}
		if ctx.Err() != nil {
			return p.flush()
		}
		if listing {
			from = 0 // cut before SYNCED: the list was incomplete
		}
		code := status.Code(err)
		switch {
		case errors.Is(err, io.EOF), code == codes.ResourceExhausted:
		case code == codes.Unavailable:
			if !received {
				return inv.callError(subject, err)
			}
		case code == codes.OutOfRange && from > 0:
			fmt.Fprintf(inv.app.stderr(), "corral: %s: revision %d is no longer kept by the appliance; listing again\n", subject, from)
			from = 0
			continue
		default:
			return inv.callError(subject, err)
		}
		fails++
		if fails == 1 {
			continue
		}
		wait := pause.NextBackOff()
		fmt.Fprintf(inv.app.stderr(), "corral: %s: %s; retrying in %v\n", subject, oneLine(status.Convert(err).Message()), wait)
		select {
		case <-ctx.Done():
			return p.flush()
		case <-time.After(wait):
		}
	}
}

// maxPendingRows bounds the initial rows a watch table holds back to
// align its columns; past it the table starts with the widths it has.
const maxPendingRows = 5000

// eventPrinter prints watch events: in table/wide a table whose header and
// column widths come from the initial list (printed when SYNCED arrives),
// then one row per change; in name one KIND/NAME line per event; in json
// one compact JSON event message per line (with its type and revision);
// in yaml one YAML document per event.
type eventPrinter struct {
	w        io.Writer
	format   string
	kindName string
	header   []string
	row      func(proto.Message) []string
	// keep filters events before printing (nil: all).
	keep func(watchEvent) bool
	// dedupes says keep drops events already printed, so an initial list
	// that was cut need not be dropped before it starts again.
	dedupes bool

	started bool
	widths  []int
	pending [][]string
}

func (p *eventPrinter) event(ev watchEvent) error {
	if p.keep != nil && ev.typ != watchv1.EventType_SYNCED && !p.keep(ev) {
		return nil
	}
	switch p.format {
	case formatJSON:
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev.raw)
		if err != nil {
			return failf("encode event: %v", err)
		}
		_, err = fmt.Fprintf(p.w, "%s\n", b)
		return writeErr(err)
	case formatYAML:
		b, err := protoJSON(ev.raw)
		if err == nil {
			b, err = yaml.JSONToYAML(b)
		}
		if err != nil {
			return failf("encode event: %v", err)
		}
		_, err = fmt.Fprintf(p.w, "---\n%s", b)
		return writeErr(err)
	case formatName:
		if ev.obj == nil {
			return nil
		}
		_, err := fmt.Fprintf(p.w, "%s/%s\n", p.kindName, recordName(ev.obj))
		return writeErr(err)
	}
	if ev.typ == watchv1.EventType_SYNCED {
		return p.flush()
	}
	if ev.obj == nil {
		return nil
	}
	cells := p.row(ev.obj)
	if !p.started {
		p.pending = append(p.pending, cells)
		if len(p.pending) >= maxPendingRows {
			return p.flush()
		}
		return nil
	}
	return p.writeRow(cells)
}

// relist drops rows held back from an initial list that was cut: the list
// starts again.
func (p *eventPrinter) relist() {
	if !p.started && !p.dedupes {
		p.pending = nil
	}
}

// flush prints the header and the initial rows, fixing the column widths.
func (p *eventPrinter) flush() error {
	if p.started || (p.format != formatTable && p.format != formatWide) {
		return nil
	}
	p.started = true
	p.widths = make([]int, len(p.header))
	for _, r := range append([][]string{p.header}, p.pending...) {
		for i, c := range r {
			if i < len(p.widths) {
				p.widths[i] = max(p.widths[i], utf8.RuneCountInString(cleanCell(c)))
			}
		}
	}
	if err := p.writeRow(p.header); err != nil {
		return err
	}
	for _, r := range p.pending {
		if err := p.writeRow(r); err != nil {
			return err
		}
	}
	p.pending = nil
	return nil
}

// writeRow writes one row padded to the table's widths (a wider cell
// pushes the rest of its row right).
func (p *eventPrinter) writeRow(cells []string) error {
	var b strings.Builder
	for i, c := range cells {
		c = cleanCell(c)
		b.WriteString(c)
		if i < len(cells)-1 {
			pad := 3
			if i < len(p.widths) {
				pad += p.widths[i] - utf8.RuneCountInString(c)
			}
			b.WriteString(strings.Repeat(" ", max(pad, 1)))
		}
	}
	_, err := io.WriteString(p.w, strings.TrimRight(b.String(), " ")+"\n")
	return writeErr(err)
}

var cellCleaner = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")

func cleanCell(c string) string { return termsafe.Escape(cellCleaner.Replace(c)) }
