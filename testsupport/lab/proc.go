package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// startDetached starts `ip args...` (every lab process runs in the lab's
// namespace through `ip netns exec`) in its own session with output to
// logPath and does not wait for it: it outlives corral-lab.
func startDetached(logPath string, args ...string) (int, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start ip: %w", err)
	}
	pid := cmd.Process.Pid
	// Reap it if it dies while corral-lab still runs; afterwards init does.
	go func() { _ = cmd.Wait() }() // its exit status is its own business
	return pid, nil
}

// cmdline returns /proc/PID/cmdline with NULs as spaces, "" when gone.
func cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

// alive reports whether pid runs (not a zombie) and its command line
// contains marker (or is empty: mid-exec, or just gone — the next look
// tells).
func alive(pid int, marker string) bool {
	if pid <= 0 {
		return false
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
		return false
	}
	cl := cmdline(pid)
	// A process in the middle of execve (ip netns exec becoming corrald)
	// shows an empty command line for a moment: still ours.
	return cl == "" || strings.Contains(cl, marker)
}

// errNotOurs is returned when a pid now belongs to another program.
var errNotOurs = errors.New("pid belongs to another process")

// stop sends SIGTERM to pid when its command line holds marker, waits up
// to grace, then SIGKILLs. A process already gone is not an error.
func stop(p Process, grace time.Duration) error {
	if p.PID <= 0 {
		return nil
	}
	cl := cmdline(p.PID)
	if cl == "" {
		return nil
	}
	if !strings.Contains(cl, p.Marker) {
		return fmt.Errorf("pid %d (%q, want %q): %w", p.PID, cl, p.Marker, errNotOurs)
	}
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !alive(p.PID, p.Marker) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if alive(p.PID, p.Marker) {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	return nil
}

// readPid reads a pid file; 0 when absent.
func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}
