package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// qmpSession runs fn on a fresh QMP connection to sock and disconnects.
// Events are never subscribed, so none has to be drained (go-qemu drops
// them when nobody listens). When ctx ends first the call returns ctx's
// error; the connection is then closed as soon as the handshake is over
// (go-qemu offers no way to interrupt the handshake itself).
//
// fn's result travels back over a channel, never through captured
// variables: after a ctx expiry fn may still be running.
func qmpSession(ctx context.Context, sock string, fn func(mon *qmp.SocketMonitor) (json.RawMessage, error)) (json.RawMessage, error) {
	dialTimeout := 2 * time.Second
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < dialTimeout {
		dialTimeout = max(time.Until(dl), time.Millisecond)
	}
	mon, err := qmp.NewSocketMonitor("unix", sock, dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", sock, err)
	}
	type result struct {
		out json.RawMessage
		err error
	}
	done := make(chan result, 1)
	connected := make(chan struct{})
	go func() {
		if err := mon.Connect(); err != nil {
			close(connected)
			_ = mon.Disconnect() // closes the socket; the handshake's error is the one to report
			done <- result{err: fmt.Errorf("qmp handshake: %w", err)}
			return
		}
		close(connected)
		out, err := fn(mon)
		_ = mon.Disconnect() // closes the socket; fn's answer is already in hand
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-ctx.Done():
		go func() {
			<-connected
			_ = mon.Disconnect() // unblocks a pending Run; safe once Connect returned
		}()
		return nil, fmt.Errorf("qmp %s: %w", sock, ctx.Err())
	}
}

func qmpCommand(mon *qmp.SocketMonitor, execute string, args any) (json.RawMessage, error) {
	cmd := qmp.Command{Execute: execute, Args: args}
	b, err := json.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	raw, err := mon.Run(b)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", execute, err)
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", execute, err)
	}
	return resp.Return, nil
}

// qmpRun runs one command in its own session.
func qmpRun(ctx context.Context, sock, execute string, args any) (json.RawMessage, error) {
	return qmpSession(ctx, sock, func(mon *qmp.SocketMonitor) (json.RawMessage, error) {
		return qmpCommand(mon, execute, args)
	})
}

// queryStatus returns QEMU's run state ("running", "paused", "prelaunch",
// "shutdown", "internal-error", ...).
func queryStatus(ctx context.Context, sock string) (string, error) {
	raw, err := qmpRun(ctx, sock, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}
