// Package swtpm runs TPM 2.0 emulators (Debian's swtpm) for tests and the
// virtual rack: one swtpm process per TPM, its state in a directory of its
// own, reached over Unix sockets in that directory (no ports to collide
// on a shared machine). Tests dial its command socket (Dial) and speak to
// it as to /dev/tpm0; QEMU attaches a machine to its control socket
// (QEMUArgs: tpm-tis on the emulator backend).
package swtpm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// TPM is one running swtpm process.
type TPM struct {
	// Dir holds the TPM's state and its sockets.
	Dir string
	cmd *exec.Cmd
	// done is closed when the process has exited.
	done chan struct{}
}

// Mode says how the emulator is reached.
type Mode int

const (
	// Commands serves TPM commands on Dir/cmd.sock (raw, as /dev/tpm0), the
	// control channel on Dir/ctrl.sock; the TPM is started (TPM2_Startup)
	// by swtpm itself. For tests.
	Commands Mode = iota + 1
	// QEMU serves only the control channel, Dir/ctrl.sock, which QEMU's
	// emulator TPM backend uses for both (it starts the TPM as firmware
	// would).
	QEMU
)

// Start runs swtpm in mode with its state in dir (made if missing; an
// existing state is kept: the same TPM, the same EK). The process ends
// when ctx ends or Stop is called. It returns once the sockets accept
// connections.
func Start(ctx context.Context, dir string, mode Mode) (*TPM, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ctrl := filepath.Join(dir, "ctrl.sock")
	args := []string{"socket", "--tpm2", "--tpmstate", "dir=" + dir,
		"--ctrl", "type=unixio,path=" + ctrl, "--log", "file=" + filepath.Join(dir, "swtpm.log")}
	wait := ctrl
	if mode == Commands {
		wait = filepath.Join(dir, "cmd.sock")
		args = append(args, "--server", "type=unixio,path="+wait, "--flags", "not-need-init,startup-clear")
	}
	for _, s := range []string{ctrl, wait} {
		_ = os.Remove(s) // a socket left by an earlier run
	}
	cmd := exec.CommandContext(ctx, "swtpm", args...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("swtpm: %w", err)
	}
	t := &TPM{Dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(t.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(wait); err == nil {
			return t, nil
		}
		select {
		case <-t.done:
			log, _ := os.ReadFile(filepath.Join(dir, "swtpm.log"))
			return nil, fmt.Errorf("swtpm exited before its socket appeared: %s", log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Stop()
			return nil, errors.New("swtpm: no socket within 10 s")
		}
	}
}

// CtrlSocket is the control channel's socket (QEMU's chardev path).
func (t *TPM) CtrlSocket() string { return filepath.Join(t.Dir, "ctrl.sock") }

// QEMUArgs are the QEMU options that give a machine this TPM (a TPM 2.0
// on the TIS interface, as most servers have).
func (t *TPM) QEMUArgs() []string {
	return []string{"-chardev", "socket,id=chrtpm,path=" + t.CtrlSocket(),
		"-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0"}
}

// Stop ends the process and waits for it.
func (t *TPM) Stop() {
	if t.cmd.Process != nil {
		_ = t.cmd.Process.Kill()
	}
	<-t.done
}

// Dial connects to a Commands-mode TPM's command socket. The connection
// takes one whole command per Write and returns one whole response per
// Read, as a TPM device does.
func (t *TPM) Dial() (io.ReadWriteCloser, error) {
	c, err := net.Dial("unix", filepath.Join(t.Dir, "cmd.sock"))
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c}, nil
}

// conn reads a response whole: a TPM response starts with a 10-byte header
// whose bytes 2-5 are its size; a stream socket may deliver it in parts.
type conn struct {
	net.Conn
	pending []byte
}

// maxResponse bounds a response (TPM 2.0 responses are at most a few KiB).
const maxResponse = 1 << 16

func (c *conn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 {
		hdr := make([]byte, 10)
		if _, err := io.ReadFull(c.Conn, hdr); err != nil {
			return 0, err
		}
		size := binary.BigEndian.Uint32(hdr[2:6])
		if size < 10 || size > maxResponse {
			return 0, fmt.Errorf("swtpm: response of %d bytes", size)
		}
		resp := make([]byte, size)
		copy(resp, hdr)
		if _, err := io.ReadFull(c.Conn, resp[10:]); err != nil {
			return 0, err
		}
		c.pending = resp
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}
