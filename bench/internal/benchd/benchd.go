// Package benchd is what the bench programs that measure a built corrald
// share: filling a data directory's store with inventoried machines while
// corrald is stopped, and running corrald on loopback until it answers,
// then reading its CPU and memory from /proc and stopping it.
package benchd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

// Fill writes n INVENTORIED machines with realistic facts
// (machinefacts.Server) into the bolt store at path, writers at once;
// corrald must be stopped. history, when not nil, gives each machine its
// fact history (called once per machine).
func Fill(path string, n, writers int, history func() []*inventoryv1.FactChange) error {
	st, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	inv, err := inventory.New(inventory.Config{Store: st, MaxDiscovered: -1})
	if err != nil {
		return err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range errs {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				m := &inventoryv1.Machine{
					Name: inventory.MachineNameForMAC(machinefacts.ServerMAC(i, 0)), Serial: fmt.Sprintf("SRV-%07d", i),
					BootMac: machinefacts.ServerMAC(i, 0), State: inventoryv1.Machine_INVENTORIED, Facts: machinefacts.Server(i),
				}
				if history != nil {
					m.FactHistory = history()
				}
				if _, err := inv.CreateMachine(context.Background(), m); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// FreeAddr is a loopback TCP address free a moment ago.
func FreeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Config says how to run corrald. Empty API and Metrics get a free
// loopback address; an empty Web leaves --web-listen at corrald's default.
type Config struct {
	Bin, Dir          string // the directory holding corrald; its data directory
	API, Web, Metrics string // listen addresses
	Ready             string // the log text that says it answers
}

// Daemon is a running corrald.
type Daemon struct {
	cmd     *exec.Cmd
	done    chan struct{}
	Metrics string // its /metrics address
}

// Start runs corrald on loopback (no DHCP, TFTP or RA) and waits, up to
// 2 minutes, until it logs c.Ready.
func Start(c Config) (*Daemon, error) {
	api, metrics := orFree(c.API), orFree(c.Metrics)
	args := []string{"serve", "--data-dir", c.Dir, "--api-listen", api}
	if c.Web != "" {
		args = append(args, "--web-listen", c.Web)
	}
	args = append(args, "--metrics-listen", metrics,
		"--boot-interface", "lo", "--dhcp-mode", "off", "--no-ra", "--tftp-listen", "off", "--http-listen", FreeAddr(), "--allow-test-images")
	cmd := exec.Command(filepath.Join(c.Bin, "corrald"), args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &Daemon{cmd: cmd, done: make(chan struct{}), Metrics: metrics}
	ready := make(chan struct{})
	var logTail []string
	go func() {
		sc := bufio.NewScanner(out)
		once := false
		for sc.Scan() {
			logTail = append(logTail[max(0, len(logTail)-20):], sc.Text())
			if !once && strings.Contains(sc.Text(), c.Ready) {
				once = true
				close(ready)
			}
		}
		_ = cmd.Wait() // its log says why it ended
		close(d.done)
	}()
	select {
	case <-ready:
		return d, nil
	case <-d.done:
		return nil, fmt.Errorf("corrald exited:\n%s", strings.Join(logTail, "\n"))
	case <-time.After(2 * time.Minute):
		d.Stop()
		return nil, errors.New("corrald did not start in 2 minutes")
	}
}

// orFree is addr, or a free loopback address when addr is empty.
func orFree(addr string) string {
	if addr == "" {
		return FreeAddr()
	}
	return addr
}

// Stop sends corrald SIGTERM and waits for it, killing it after 30 s.
func (d *Daemon) Stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM) // an exited process is fine
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// CPU is corrald's user+system CPU so far (/proc/PID/stat, clock ticks
// of 10 ms).
func (d *Daemon) CPU() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// Status reads a kB field of corrald's /proc status (VmRSS, VmHWM).
func (d *Daemon) Status(field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
