// Package api_test checks that n0stack `do` file arguments decode into
// Corral's request messages with no unknown fields.
package api_test

import (
	"testing"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Task arguments in the shape n0stack's examples use (n0cli `do`):
// snake_case proto names, annotations for placement, sizes in bytes.
var n0stackArgs = map[string]struct {
	msg  proto.Message
	args string
}{
	"ApplyNetwork": {&poolv1.ApplyNetworkRequest{}, `
name: privatenetwork
ipv4_cidr: 192.168.0.0/24
annotations:
  n0core/provisioning/virtual_machine/vlan_id: "100"
`},
	"ApplyImage": {&deploymentv1.ApplyImageRequest{}, `
name: cloudimage-ubuntu
`},
	"FetchBlockStorage": {&provisioningv1.FetchBlockStorageRequest{}, `
name: cloudimage-ubuntu-1804
annotations:
  n0core/provisioning/block_storage/request_node_name: vm-host1
request_bytes: 1073741824
limit_bytes: 10737418240
source_url: https://cloud-images.ubuntu.com/bionic/current/bionic-server-cloudimg-amd64.img
`},
	"RegisterBlockStorage": {&deploymentv1.RegisterBlockStorageRequest{}, `
image_name: cloudimage-ubuntu
block_storage_name: cloudimage-ubuntu-1804
tags:
  - latest
  - "18.04"
`},
	"GenerateBlockStorage": {&deploymentv1.GenerateBlockStorageRequest{}, `
image_name: cloudimage-ubuntu
tag: "18.04"
block_storage_name: ubuntu-disk
annotations:
  n0core/provisioning/block_storage/request_node_name: vm-host1
request_bytes: 1073741824
limit_bytes: 10737418240
`},
	"CreateVirtualMachine": {&provisioningv1.CreateVirtualMachineRequest{}, `
name: ubuntu
annotations:
  n0core/provisioning/virtual_machine/request_node_name: vm-host1
request_cpu_milli_core: 10
limit_cpu_milli_core: 1000
request_memory_bytes: 1073741824
limit_memory_bytes: 1073741824
block_storage_names:
  - ubuntu-disk
nics:
  - network_name: privatenetwork
    ipv4_address: 192.168.0.10
login_username: user
ssh_authorized_keys:
  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKJQ user@example
`},
	"ReserveCompute": {&poolv1.ReserveComputeRequest{}, `
node_name: vm-host1
compute_name: test-reserve
request_cpu_milli_core: 10
limit_cpu_milli_core: 10
request_memory_bytes: 10
limit_memory_bytes: 10
`},
	"ReserveStorage": {&poolv1.ReserveStorageRequest{}, `
node_name: vm-host1
storage_name: test-reserve
request_bytes: 10
limit_bytes: 10
`},
}

func TestN0stackArgsDecode(t *testing.T) {
	for name, tc := range n0stackArgs {
		t.Run(name, func(t *testing.T) {
			js, err := yaml.YAMLToJSON([]byte(tc.args))
			if err != nil {
				t.Fatal(err)
			}
			m := tc.msg.ProtoReflect().New().Interface()
			if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, m); err != nil {
				t.Fatalf("%s args do not decode: %v", name, err)
			}
			if proto.Size(m) == 0 {
				t.Fatalf("%s decoded to an empty message", name)
			}
		})
	}
	// And an unknown field is refused, not dropped.
	m := &poolv1.ApplyNetworkRequest{}
	if err := protojson.Unmarshal([]byte(`{"name":"x","ipv4cidr_typo":"10.0.0.0/24"}`), m); err == nil {
		t.Fatal("unknown field accepted")
	}
}
