package cli

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// seed fills s with two nodes, a network and a machine.
func seed(s *testServer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes["n1"] = &poolv1.Node{
		Name:          "n1",
		Labels:        map[string]string{"tier": "gold"},
		Address:       "10.0.0.11",
		CpuMilliCores: 16000,
		MemoryBytes:   64 << 30,
		StorageBytes:  1 << 40,
		Rack:          "r1",
		State:         poolv1.Node_READY,
		ReservedComputes: map[string]*poolv1.Compute{
			"vm1": {RequestCpuMilliCore: 1500, LimitCpuMilliCore: 2000, RequestMemoryBytes: 3 << 29, LimitMemoryBytes: 2 << 30},
		},
		ReservedStorages: map[string]*poolv1.Storage{
			"disk1": {RequestBytes: 100 << 30, LimitBytes: 200 << 30},
		},
		LastHeartbeat: timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)),
	}
	s.nodes["n2"] = &poolv1.Node{
		Name:          "n2",
		CpuMilliCores: 8000,
		MemoryBytes:   32 << 30,
		State:         poolv1.Node_NOT_READY,
	}
	s.networks["lan"] = &poolv1.Network{
		Name:        "lan",
		Ipv4Cidr:    "192.168.0.0/24",
		Ipv6Cidr:    "fd00::/64",
		Ipv4Gateway: "192.168.0.1",
		Ipv6Gateway: "fd00::1",
		VlanId:      100,
		State:       poolv1.Network_AVAILABLE,
		ReservedNetworkInterfaces: map[string]*poolv1.NetworkInterface{
			"vm1-eth0": {HardwareAddress: "52:54:00:00:00:01", Ipv4Address: "192.168.0.10"},
		},
	}
	s.networks["wan"] = &poolv1.Network{Name: "wan", Ipv4Cidr: "203.0.113.0/28"}
	s.machines["m1"] = &inventoryv1.Machine{
		Name:       "m1",
		Serial:     "SN123",
		BootMac:    "aa:bb:cc:dd:ee:01",
		State:      inventoryv1.Machine_DEPLOYED,
		PowerState: inventoryv1.PowerState_POWER_STATE_ON,
		NodeName:   "n1",
		Facts: &inventoryv1.Facts{
			System: &inventoryv1.Facts_System{Vendor: "Dell Inc.", Product: "PowerEdge R650"},
			Cpu:    &inventoryv1.Facts_Cpu{Threads: 64},
			Memory: &inventoryv1.Facts_Memory{TotalBytes: 256 << 30},
			Disks:  []*inventoryv1.Facts_Disk{{Name: "nvme0n1", SizeBytes: 2 << 40}, {Name: "nvme1n1", SizeBytes: 2 << 40}},
		},
		Flags: []string{"duplicate-serial: test"},
	}
	s.machines["m2"] = &inventoryv1.Machine{Name: "m2", BootMac: "aa:bb:cc:dd:ee:02", State: inventoryv1.Machine_DISCOVERED}
}
