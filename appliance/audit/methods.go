package audit

import (
	"cmp"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/store"
)

// auditClass says what the audit does with calls of one method.
type auditClass int

const (
	// auditMutating: recorded after it finishes, whatever the outcome.
	auditMutating auditClass = iota + 1
	// auditRead: a read, not recorded.
	auditRead
	// auditTraffic: high-volume machine traffic (agent sessions and their
	// heartbeats), not recorded; what it changes is on the machine's
	// timeline already.
	auditTraffic
)

// auditRule is how one RPC is audited.
type auditRule struct {
	class auditClass
	// kind and field name the object: "<kind>/<value of field in the
	// request>" (a string field; empty field: kind alone, if any).
	kind, field string
	// machine: the object is a physical machine; the call also goes on its
	// boot timeline (as timelineVerb's words).
	machine bool
	// nodeHeartbeat: a NODE principal's successful call is the node's
	// heartbeat (ApplyNode every 10 s): not recorded.
	nodeHeartbeat bool
}

func mutating(kind, field string) auditRule {
	return auditRule{class: auditMutating, kind: kind, field: field}
}

var (
	readRule     = auditRule{class: auditRead}
	machineRule  = auditRule{class: auditMutating, kind: "machine", field: "name", machine: true}
	trafficRule  = auditRule{class: auditTraffic}
	unknownRule  = auditRule{class: auditMutating} // a method not in the table is recorded
	auditPrefix  = store.AuditPrefix
	auditSkipped = []string{"/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/"}
)

// auditRules classifies every RPC corrald serves. A test checks it against
// the registered services, so a new RPC cannot slip through unclassified
// (and until it is classified, it is recorded as mutating).
var auditRules = map[string]auditRule{
	"/corral.inventory.v1.MachineService/ListMachines":       readRule,
	"/corral.inventory.v1.MachineService/GetMachine":         readRule,
	"/corral.inventory.v1.MachineService/GetPower":           readRule,
	"/corral.inventory.v1.MachineService/Timeline":           readRule,
	"/corral.inventory.v1.MachineService/WatchMachines":      readRule,
	"/corral.inventory.v1.MachineService/WatchTimeline":      readRule,
	"/corral.inventory.v1.MachineService/EnrollMachine":      machineRule,
	"/corral.inventory.v1.MachineService/AcceptMachine":      machineRule,
	"/corral.inventory.v1.MachineService/DeleteMachine":      machineRule,
	"/corral.inventory.v1.MachineService/SetPower":           machineRule,
	"/corral.inventory.v1.MachineService/SetBootDevice":      machineRule,
	"/corral.inventory.v1.MachineService/ReprovisionMachine": machineRule,
	"/corral.inventory.v1.MachineService/SetMaintenance":     machineRule,
	"/corral.inventory.v1.MachineService/AdoptMachine":       machineRule,
	"/corral.inventory.v1.MachineService/RejectMachine":      machineRule,
	"/corral.inventory.v1.MachineService/LabelMachine":       machineRule,
	"/corral.inventory.v1.MachineService/ReleaseMachine":     machineRule,
	"/corral.inventory.v1.MachineService/DeployMachine":      machineRule,
	// A rotation's request names the machine only; no password is in
	// any request or answer.
	"/corral.inventory.v1.BmcCredentialService/RotateBmcCredentials": machineRule,
	// Clearing a console's SSH host key pin: the next link trusts the
	// key it meets, so who cleared it is on record.
	"/corral.inventory.v1.BmcCredentialService/ForgetBmcHostKey": machineRule,
	// BIOS settings, firmware updates and virtual media change the
	// machine through its BMC (each on its timeline too).
	"/corral.inventory.v1.BmcRedfishService/GetBios":           readRule,
	"/corral.inventory.v1.BmcRedfishService/ListFirmware":      readRule,
	"/corral.inventory.v1.BmcRedfishService/SetBios":           machineRule,
	"/corral.inventory.v1.BmcRedfishService/UpdateFirmware":    machineRule,
	"/corral.inventory.v1.BmcRedfishService/InsertMedia":       machineRule,
	"/corral.inventory.v1.BmcRedfishService/EjectMedia":        machineRule,
	"/corral.inventory.v1.CommissionService/CommissionMachine": machineRule,
	"/corral.inventory.v1.CommissionService/ClearCommission":   machineRule,
	// The machines an allocation claims are on their timelines already.
	"/corral.inventory.v1.MachineService/AllocateMachines": mutating("allocation", "selector"),

	"/corral.node.v1.AgentService/Register": mutating("mac", "boot_mac"),
	"/corral.node.v1.AgentService/Session":  trafficRule,
	"/corral.node.v1.AgentService/Join":     mutating("node", "name"),
	// A TPM challenge changes no record: the Register carrying its proof
	// is recorded, and a refusal goes on the MAC's timeline.
	"/corral.node.v1.AgentService/AttestBegin": trafficRule,

	"/corral.pool.v1.NodeService/ListNodes":       readRule,
	"/corral.pool.v1.NodeService/GetNode":         readRule,
	"/corral.pool.v1.NodeService/WatchNodes":      readRule,
	"/corral.pool.v1.NodeService/ApplyNode":       {class: auditMutating, kind: "node", field: "name", nodeHeartbeat: true},
	"/corral.pool.v1.NodeService/DeleteNode":      mutating("node", "name"),
	"/corral.pool.v1.NodeService/ScheduleCompute": mutating("compute", "compute_name"),
	"/corral.pool.v1.NodeService/ReserveCompute":  mutating("compute", "compute_name"),
	"/corral.pool.v1.NodeService/ReleaseCompute":  mutating("compute", "compute_name"),
	"/corral.pool.v1.NodeService/ScheduleStorage": mutating("storage", "storage_name"),
	"/corral.pool.v1.NodeService/ReserveStorage":  mutating("storage", "storage_name"),
	"/corral.pool.v1.NodeService/ReleaseStorage":  mutating("storage", "storage_name"),

	"/corral.pool.v1.NetworkService/ListNetworks":            readRule,
	"/corral.pool.v1.NetworkService/GetNetwork":              readRule,
	"/corral.pool.v1.NetworkService/WatchNetworks":           readRule,
	"/corral.pool.v1.NetworkService/ApplyNetwork":            mutating("network", "name"),
	"/corral.pool.v1.NetworkService/DeleteNetwork":           mutating("network", "name"),
	"/corral.pool.v1.NetworkService/ReserveNetworkInterface": mutating("network", "network_name"),
	"/corral.pool.v1.NetworkService/ReleaseNetworkInterface": mutating("network", "network_name"),

	"/corral.provisioning.v1.BlockStorageService/ListBlockStorages":    readRule,
	"/corral.provisioning.v1.BlockStorageService/GetBlockStorage":      readRule,
	"/corral.provisioning.v1.BlockStorageService/DownloadBlockStorage": readRule,
	"/corral.provisioning.v1.BlockStorageService/WatchBlockStorages":   readRule,
	"/corral.provisioning.v1.BlockStorageService/CreateBlockStorage":   mutating("blockstorage", "name"),
	"/corral.provisioning.v1.BlockStorageService/FetchBlockStorage":    mutating("blockstorage", "name"),
	"/corral.provisioning.v1.BlockStorageService/CopyBlockStorage":     mutating("blockstorage", "name"),
	"/corral.provisioning.v1.BlockStorageService/UpdateBlockStorage":   mutating("blockstorage", "name"),
	"/corral.provisioning.v1.BlockStorageService/DeleteBlockStorage":   mutating("blockstorage", "name"),
	"/corral.provisioning.v1.BlockStorageService/UndeleteBlockStorage": mutating("blockstorage", "name"),
	"/corral.provisioning.v1.BlockStorageService/PurgeBlockStorage":    mutating("blockstorage", "name"),

	"/corral.provisioning.v1.VirtualMachineService/ListVirtualMachines":    readRule,
	"/corral.provisioning.v1.VirtualMachineService/GetVirtualMachine":      readRule,
	"/corral.provisioning.v1.VirtualMachineService/WatchVirtualMachines":   readRule,
	"/corral.provisioning.v1.VirtualMachineService/CreateVirtualMachine":   mutating("virtualmachine", "name"),
	"/corral.provisioning.v1.VirtualMachineService/UpdateVirtualMachine":   mutating("virtualmachine", "name"),
	"/corral.provisioning.v1.VirtualMachineService/DeleteVirtualMachine":   mutating("virtualmachine", "name"),
	"/corral.provisioning.v1.VirtualMachineService/BootVirtualMachine":     mutating("virtualmachine", "name"),
	"/corral.provisioning.v1.VirtualMachineService/RebootVirtualMachine":   mutating("virtualmachine", "name"),
	"/corral.provisioning.v1.VirtualMachineService/ShutdownVirtualMachine": mutating("virtualmachine", "name"),
	// OpenConsole changes nothing but hands out a console: who got one
	// matters.
	"/corral.provisioning.v1.VirtualMachineService/OpenConsole": mutating("virtualmachine", "name"),

	"/corral.deployment.v1.ImageService/ListImages":             readRule,
	"/corral.deployment.v1.ImageService/GetImage":               readRule,
	"/corral.deployment.v1.ImageService/ApplyImage":             mutating("image", "name"),
	"/corral.deployment.v1.ImageService/DeleteImage":            mutating("image", "name"),
	"/corral.deployment.v1.ImageService/RegisterBlockStorage":   mutating("image", "image_name"),
	"/corral.deployment.v1.ImageService/UnregisterBlockStorage": mutating("image", "image_name"),
	"/corral.deployment.v1.ImageService/GenerateBlockStorage":   mutating("blockstorage", "block_storage_name"),
	"/corral.deployment.v1.ImageService/TagImage":               mutating("image", "name"),
	"/corral.deployment.v1.ImageService/UntagImage":             mutating("image", "name"),

	// UploadOSImage is a stream: its object is the kind alone (a
	// stream's messages are never looked at).
	"/corral.osimage.v1.OSImageService/ListOSImages":    readRule,
	"/corral.osimage.v1.OSImageService/GetOSImage":      readRule,
	"/corral.osimage.v1.OSImageService/RegisterOSImage": mutating("osimage", "name"),
	"/corral.osimage.v1.OSImageService/UploadOSImage":   mutating("osimage", ""),
	"/corral.osimage.v1.OSImageService/DeleteOSImage":   mutating("osimage", "name"),

	// ApplyStandbyPool's object is the pool it wrote, read from the
	// response (auditResponseObject).
	"/corral.inventory.v1.StandbyPoolService/ListStandbyPools":  readRule,
	"/corral.inventory.v1.StandbyPoolService/GetStandbyPool":    readRule,
	"/corral.inventory.v1.StandbyPoolService/ApplyStandbyPool":  mutating("standbypool", ""),
	"/corral.inventory.v1.StandbyPoolService/DeleteStandbyPool": mutating("standbypool", "name"),

	// CreateToken's object is the new token's id, read from the response
	// (auditResponseObject); the secret in it is never looked at.
	"/corral.auth.v1.TokenService/CreateToken": mutating("token", ""),
	"/corral.auth.v1.TokenService/ListTokens":  readRule,
	"/corral.auth.v1.TokenService/RevokeToken": mutating("token", "id"),

	"/corral.fleet.v1.ApplianceService/ListAppliances": readRule,
	// FetchArtifact: peer appliances copy boot artifacts (a read).
	"/corral.fleet.v1.ApplianceService/FetchArtifact": readRule,

	"/corral.admin.v1.BackupService/Backup":           mutating("backup", ""),
	"/corral.webhook.v1.WebhookService/AddWebhook":    mutating("webhook", "name"),
	"/corral.webhook.v1.WebhookService/ListWebhooks":  readRule,
	"/corral.webhook.v1.WebhookService/RemoveWebhook": mutating("webhook", "name"),
	"/corral.webhook.v1.WebhookService/EnableWebhook": mutating("webhook", "name"),

	// A console stream is recorded at its end (the object alone, as
	// every stream), and each viewer's attach, take-write and detach as
	// events of their own on the machine (Recorder.Note).
	"/corral.console.v1.ConsoleService/Attach": mutating("console", ""),

	"/corral.audit.v1.AuditService/ListEvents":  readRule,
	"/corral.audit.v1.AuditService/WatchEvents": readRule,
}

// auditRuleFor returns the rule of method and whether it is audited at
// all (health checks and reflection are not).
func auditRuleFor(method string) (auditRule, bool) {
	for _, p := range auditSkipped {
		if strings.HasPrefix(method, p) {
			return auditRule{}, false
		}
	}
	if r, ok := auditRules[method]; ok {
		return r, r.class == auditMutating
	}
	return unknownRule, true
}

// Bounds of what a record copies from a call.
const (
	maxAuditObjectBytes  = 256
	maxAuditMessageBytes = 512
	maxAuditWhoBytes     = 320
)

// auditObject names the call's object from the request's rule field
// (never anything else of the request: it may carry secrets). The value
// is the caller's to choose, and an unauthenticated caller's too: its
// control characters are escaped (internal/termsafe) before the record
// is stored and printed by `corral get events`.
func auditObject(r auditRule, req any) string {
	if r.kind == "" {
		return ""
	}
	if r.field == "" {
		return r.kind
	}
	m, ok := req.(proto.Message)
	if !ok || m == nil {
		return r.kind
	}
	fd := m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(r.field))
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() {
		return r.kind
	}
	v := m.ProtoReflect().Get(fd).String()
	if v == "" {
		return r.kind
	}
	return r.kind + "/" + clipUTF8(termsafe.Escape(v), maxAuditObjectBytes)
}

// auditResponseObject completes the object and machine from a response
// where the request does not name them: a new token's id, the machine an
// agent's Register matched.
func auditResponseObject(object string, resp any) (string, string) {
	switch r := resp.(type) {
	case *authv1.CreateTokenResponse:
		if id := r.GetInfo().GetId(); id != "" {
			return "token/" + clipUTF8(id, maxAuditObjectBytes), ""
		}
	case *nodev1.RegisterResponse:
		return object, clipUTF8(r.GetMachineName(), maxAuditObjectBytes)
	case *inventoryv1.ApplyStandbyPoolResponse:
		if n := r.GetPool().GetName(); n != "" {
			return "standbypool/" + clipUTF8(termsafe.Escape(n), maxAuditObjectBytes), ""
		}
	}
	return object, ""
}

// timelineVerb says what a machine call did, in a few words for the
// machine's timeline ("power off", "maintenance on").
func timelineVerb(method string, req any) string {
	switch r := req.(type) {
	case *inventoryv1.SetPowerRequest:
		return "power " + enumWords(r.GetAction().String(), "POWER_ACTION_")
	case *inventoryv1.SetBootDeviceRequest:
		return "boot device " + enumWords(r.GetDevice().String(), "BOOT_DEVICE_")
	case *inventoryv1.SetMaintenanceRequest:
		if r.GetOn() {
			return "maintenance on"
		}
		return "maintenance off"
	case *inventoryv1.AcceptMachineRequest:
		if r.GetTarget() == inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL {
			return "accept to the pool"
		}
		return "accept"
	case *inventoryv1.LabelMachineRequest:
		return "label"
	case *inventoryv1.ReleaseMachineRequest:
		if l := r.GetErase(); l != inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT {
			return "release, erase " + enumWords(l.String(), "ERASE_LEVEL_")
		}
		return "release"
	case *inventoryv1.DeployMachineRequest:
		// The image only: never the user data, keys or layout.
		return "deploy " + clipUTF8(termsafe.Escape(r.GetOsImage()), 64)
	case *inventoryv1.AdoptMachineRequest:
		if r.GetSeparate() {
			return "adopt as a machine of its own"
		}
		return "adopt"
	case *inventoryv1.RejectMachineRequest:
		return "reject"
	case *inventoryv1.ReprovisionMachineRequest:
		return "reprovision"
	case *inventoryv1.DeleteMachineRequest:
		return "delete"
	case *inventoryv1.EnrollMachineRequest:
		return "enroll BMC"
	case *inventoryv1.RotateBmcCredentialsRequest:
		return "rotate BMC credentials"
	case *inventoryv1.ForgetBmcHostKeyRequest:
		return "forget BMC console host key"
	case *inventoryv1.SetBiosRequest:
		return fmt.Sprintf("set %d BIOS settings", len(r.GetSettings()))
	case *inventoryv1.UpdateFirmwareRequest:
		return "update firmware from image " + r.GetImage()
	case *inventoryv1.InsertMediaRequest:
		return "insert virtual media " + r.GetImage()
	case *inventoryv1.EjectMediaRequest:
		return "eject virtual media"
	case *inventoryv1.CommissionMachineRequest:
		return "commission (profile " + cmp.Or(r.GetProfile(), "quick") + ")"
	case *inventoryv1.ClearCommissionRequest:
		return "clear commissioning failure"
	}
	_, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	return name
}

// enumWords turns POWER_ACTION_SOFT_OFF into "soft off".
func enumWords(s, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s, prefix)), "_", " ")
}

// clipUTF8 makes s valid UTF-8 and cuts it to at most n bytes on a rune
// boundary.
func clipUTF8(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Classified reports whether method is in the audit's table (mutating,
// read or machine traffic). The appliance's tests check every method it
// serves against it; an unclassified method is recorded as mutating.
func Classified(method string) bool {
	_, ok := auditRules[method]
	return ok
}
