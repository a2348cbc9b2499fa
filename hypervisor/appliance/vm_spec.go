package appliance

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// uuidNamespace is n0stack's namespace for VM UUIDs derived from names.
var uuidNamespace = [16]byte{0xa0, 0x15, 0xd1, 0x8d, 0xb2, 0xc3, 0x41, 0x81, 0x80, 0x28, 0x6f, 0x70, 0x7e, 0xf3, 0x1c, 0x95}

// uuidV5 is RFC 9562 UUIDv5 (SHA-1) of name in ns.
func uuidV5(ns [16]byte, name string) string {
	h := sha1.New()
	h.Write(ns[:])
	h.Write([]byte(name))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	return formatUUID(u)
}

func formatUUID(u [16]byte) string {
	b := hex.EncodeToString(u[:])
	return b[0:8] + "-" + b[8:12] + "-" + b[12:16] + "-" + b[16:20] + "-" + b[20:32]
}

// parseUUID accepts the canonical 8-4-4-4-12 form (any case, optional
// urn:uuid: or braces) and returns it canonical.
func parseUUID(s string) (string, bool) {
	t := strings.TrimPrefix(strings.ToLower(s), "urn:uuid:")
	t = strings.TrimSuffix(strings.TrimPrefix(t, "{"), "}")
	if len(t) != 36 || t[8] != '-' || t[13] != '-' || t[18] != '-' || t[23] != '-' {
		return "", false
	}
	b, err := hex.DecodeString(strings.ReplaceAll(t, "-", ""))
	if err != nil || len(b) != 16 {
		return "", false
	}
	return t, true
}

var userRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// validateVM checks a create request; it returns the UUID to use.
func validateVM(req *provisioningv1.CreateVirtualMachineRequest) (string, error) {
	name := req.GetName()
	if err := checkName("name", name); err != nil {
		return "", err
	}
	if len(name) > maxVMName {
		return "", apierr.Invalidf("virtual machine name %q is longer than %d characters", name, maxVMName)
	}
	if err := checkUserMeta(req.GetAnnotations(), req.GetLabels()); err != nil {
		return "", err
	}
	if err := checkResources(name, req.GetRequestCpuMilliCore(), req.GetLimitCpuMilliCore(), req.GetRequestMemoryBytes(), req.GetLimitMemoryBytes()); err != nil {
		return "", err
	}
	id := uuidV5(uuidNamespace, name)
	if req.GetUuid() != "" {
		u, ok := parseUUID(req.GetUuid())
		if !ok {
			return "", apierr.Invalidf("uuid %q is not a UUID", req.GetUuid())
		}
		id = u
	}
	seen := map[string]bool{}
	for _, d := range req.GetBlockStorageNames() {
		if err := checkName("block_storage_names entry", d); err != nil {
			return "", err
		}
		if seen[d] {
			return "", apierr.Invalidf("block storage %q is listed twice", d)
		}
		seen[d] = true
	}
	for i, n := range req.GetNics() {
		if err := checkName(fmt.Sprintf("nics[%d].network_name", i), n.GetNetworkName()); err != nil {
			return "", err
		}
	}
	if u := req.GetLoginUsername(); u != "" && !userRE.MatchString(u) {
		return "", apierr.Invalidf("login_username %q is not a valid Linux user name", u)
	}
	for i, k := range req.GetSshAuthorizedKeys() {
		if strings.ContainsAny(k, "\r\n") || strings.TrimSpace(k) == "" {
			return "", apierr.Invalidf("ssh_authorized_keys[%d] must be one non-empty line", i)
		}
	}
	return id, nil
}

// checkResources enforces the VM compute rules: CPU limit a positive
// multiple of 1000 (vCPUs = limit/1000), 0 < request ≤ limit, and memory
// request == limit (no ballooning).
func checkResources(name string, reqCPU, limCPU uint32, reqMem, limMem uint64) error {
	switch {
	case limCPU == 0 || limCPU%1000 != 0:
		return apierr.Invalidf("virtual machine %q: limit_cpu_milli_core %d must be a positive multiple of 1000 (vCPUs = limit/1000)", name, limCPU)
	case reqCPU == 0 || reqCPU > limCPU:
		return apierr.Invalidf("virtual machine %q: request_cpu_milli_core %d must be > 0 and <= limit_cpu_milli_core %d", name, reqCPU, limCPU)
	case limMem == 0:
		return apierr.Invalidf("virtual machine %q: limit_memory_bytes must be > 0", name)
	case reqMem != limMem:
		return apierr.Invalidf("virtual machine %q: request_memory_bytes %d must equal limit_memory_bytes %d (memory ballooning is not supported)", name, reqMem, limMem)
	}
	return nil
}

// ifaceName is the pool interface name of a VM's i-th NIC.
func ifaceName(vm string, i int) string { return vm + "-" + strconv.Itoa(i) }
