package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// StateFile is the name of the state file inside the lab directory.
const StateFile = "lab.json"

// State is everything a running lab consists of. Up writes it before each
// side effect, so Down can undo a partial Up.
type State struct {
	ID        string    `json:"id"`
	Dir       string    `json:"dir"`
	RunDir    string    `json:"run_dir"`
	CreatedAt time.Time `json:"created_at"`
	Bin       Binaries  `json:"bin"`

	Namespace string `json:"namespace"`
	Bridge    string `json:"bridge"`
	// Subnet is the bridge's /24 prefix as "a.b.c" (bridge at .1).
	Subnet string `json:"subnet"`
	// VethHost and VethNS are the host↔namespace pair; HostAddr and
	// NSAddr their /30 addresses (NSAddr serves the API to the host).
	VethHost string `json:"veth_host"`
	VethNS   string `json:"veth_ns"`
	HostAddr string `json:"host_addr"`
	NSAddr   string `json:"ns_addr"`

	DataDir      string   `json:"data_dir"`
	ClientConfig string   `json:"client_config"`
	Corrald      Process  `json:"corrald"`
	CorraldArgs  []string `json:"corrald_args"`
	AutoAccept   bool     `json:"auto_accept"`
	// Web: corrald serves the web page on WebPort.
	Web     bool `json:"web,omitempty"`
	WithBMC bool `json:"with_bmc"`

	Machines []Machine `json:"machines"`

	// Fleet mode (up --appliances N, N ≥ 2; fleet.go): the etcd members
	// and the appliances. DataDir, ClientConfig and Corrald are then the
	// first appliance's; a single-appliance lab leaves these empty.
	Etcd          []EtcdMember `json:"etcd,omitempty"`
	EtcdPrefix    string       `json:"etcd_prefix,omitempty"`
	Appliances    []Appliance  `json:"appliances,omitempty"`
	ApplianceDHCP string       `json:"appliance_dhcp,omitempty"`
}

// Binaries are the programs the lab runs.
type Binaries struct {
	Corrald string `json:"corrald"`
	Corral  string `json:"corral"`
}

// Process is a process the lab started; Marker must appear in its
// /proc/PID/cmdline before it is signalled (pids are reused).
type Process struct {
	PID    int    `json:"pid"`
	Marker string `json:"marker"`
}

// Machine is one virtual server.
type Machine struct {
	Name      string    `json:"name"`
	Dir       string    `json:"dir"`
	Firmware  string    `json:"firmware"` // bios or uefi
	Serial    string    `json:"serial"`
	Board     string    `json:"board_serial"`
	UUID      string    `json:"uuid"`
	MAC       string    `json:"mac"`
	Tap       string    `json:"tap"`
	Disks     []Disk    `json:"disks"`
	MemoryMiB int       `json:"memory_mib"`
	CPUs      int       `json:"cpus"`
	BMCPort   int       `json:"bmc_port,omitempty"`
	VMPort    int       `json:"vm_port,omitempty"`
	BMCUser   string    `json:"bmc_user,omitempty"`
	BMCPwFile string    `json:"bmc_password_file,omitempty"`
	Sim       Process   `json:"ipmi_sim"`
	PoweredAt time.Time `json:"powered_at"`
	// TPM gives the machine a TPM 2.0 (tpm-tis) emulated by its own swtpm,
	// its state in Dir/tpm: the same endorsement key every boot.
	TPM bool `json:"tpm,omitempty"`
}

// Disk is one disk of a machine: virtio-blk, or NVMe.
type Disk struct {
	Path   string `json:"path"`
	Serial string `json:"serial"`
	GiB    int    `json:"gib"`
	// Bus is "nvme" for an NVMe controller, "" (or "virtio") for
	// virtio-blk.
	Bus string `json:"bus,omitempty"`
}

// Chassis is the machine's chassis_control program (power and boot
// device); ipmi_sim runs it, or the lab itself without a BMC.
func (m Machine) Chassis() string { return filepath.Join(m.Dir, "chassis") }

// QEMUPidFile holds the pid of the machine's running QEMU.
func (m Machine) QEMUPidFile() string { return filepath.Join(m.Dir, "qemu.pid") }

// Console is the machine's serial console log.
func (m Machine) Console() string { return filepath.Join(m.Dir, "console.log") }

// ErrNoLab is returned when the directory holds no state file.
var ErrNoLab = errors.New("no lab here")

// LoadState reads dir's state file.
func LoadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w (corral-lab up first)", dir, ErrNoLab)
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	return &s, nil
}

// Save writes the state file atomically.
func (s *State) Save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(s.Dir, StateFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
