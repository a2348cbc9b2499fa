package corral_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/corralhq/corral"

// importRule says what the Go files under one folder may import of
// Corral's own packages. The longest matching folder wins. May lists
// folder prefixes ("" = the module root package, "*" = anything).
type importRule struct {
	folder string
	may    []string
	why    string
}

// importRules is the house's import table (docs/architecture.md says it in
// words). Floors, bottom up: leaves (api, internal leaves) → store →
// auth, inventory, images, ipmi, agent, boot, deploy, hypervisor →
// lifecycle → appliance/{metrics,audit,backup} → appliance (composition)
// → cmd. Test support sits beside cmd and is never imported by product
// code.
var importRules = []importRule{
	{"api", []string{"api"}, "generated API: protobuf and gRPC only"},
	{"api/clientconfig", []string{"api"}, "the client configuration file and its dialling (TLS to the appliance's identity, the bearer token), in the API module so users' programs need nothing of the appliance"},
	{"api/client", []string{"api"}, "the API module's small client: one connection from a configuration file, a stub per service"},
	{"api/examples", []string{"api"}, "example programs of the API module: what a user's program may use"},
	{"terraform-provider-corral", []string{"api", "terraform-provider-corral"}, "the Terraform/OpenTofu provider, a module of its own: the API module's client and generated code, nothing of the appliance"},
	{"internal", nil, "internal/<leaf>: error classes, node identity layout, the block map format, flag/config, source finder, initramfs writer, rate-limited log lines, per-key rate limiters, control-character escaping: import nothing of ours"},
	{"internal/paging", []string{"internal/apierr"}, "the page size, page token and client loop every List RPC shares"},
	{"store", []string{"store", "api/store", "internal/apierr"}, "the store contract, its backends and the record codec"},
	{"internal/watchstream", []string{"store", "api/watch", "internal/apierr", "internal/lograte"}, "the corral.watch.v1 contract every Watch RPC follows, on the store's resumable watch"},
	{"auth", []string{"auth", "api", "store", "internal/apierr", "internal/paging", "internal/nodeid"}, "tokens in the store, the CA, the gRPC interceptor"},
	{"auth/tpmid", []string{"api", "internal/apierr"}, "TPM endorsement-key identity: credential-activation challenges and EK certificate checks (go-attestation), in memory; no store, nothing else of ours"},
	{"inventory", []string{"api", "store", "inventory/timeline", "internal/apierr", "internal/lograte", "internal/paging", "internal/termsafe", "internal/watchstream"}, "machines: identity, facts, their indexes, the state machine, the MachineService edge; of its sub-packages only the timeline, which it composes (bmc builds on it, pool sits beside it)"},
	{"inventory/pool", []string{"inventory/pool", "api", "store", "internal/apierr", "internal/paging", "internal/lograte", "internal/watchstream"}, "the node pool: budgets, scheduling, IPAM"},
	{"inventory/bmc", []string{"inventory/bmc", "inventory", "api", "store", "internal/apierr"}, "BMC control (enrolment, sealed passwords, power, boot device) over inventory's machines, through interfaces it declares; inventory never imports it"},
	{"inventory/layout", []string{"api", "internal/apierr"}, "disk layouts as data: the YAML, its checks and its resolution against a machine's facts, pure (the appliance and the agent's plan both carry its result)"},
	{"inventory/timeline", []string{"api", "store", "internal/keyrate", "internal/lograte", "internal/termsafe"}, "the boot timeline: entries in the store, nothing of inventory (inventory composes it); the boot LAN's entries rate-limited per MAC and source"},
	{"lifecycle", []string{"lifecycle", "api", "inventory", "internal/apierr", "internal/keyrate", "internal/lograte", "internal/termsafe"}, "the machine lifecycle consumes inventory through its own interfaces; the phone-home handler rate-limits per source"},
	{"lifecycle/standby", []string{"lifecycle", "api", "inventory", "store", "internal/apierr", "internal/paging"}, "standby pools: their records in the store and StandbyPoolService; the controller reaches machines and power through interfaces it declares (inventory's selectors parse its terms)"},
	{"lifecycle/nocloud", []string{"api", "internal/apierr"}, "a deploy's cloud-init NoCloud seed, rendered from values: pure, nothing of the lifecycle"},
	{"fleet", []string{"fleet", "api", "store", "internal/apierr", "internal/paging", "internal/lograte"}, "runners, the leader's dispatch of per-machine work and its owners: records in the store (inventory's machines and boot's leases read by prefix, not imported)"},
	{"fleet/artifactsync", []string{"fleet", "api", "store", "images", "internal/apierr"}, "the fleet's boot artifacts: a manifest in the shared store and peer fetches over ApplianceService, into the local catalog's content store (images)"},
	{"ipmi", []string{"ipmi"}, "BMC drivers behind bmclib: nothing of ours"},
	{"ipmi/sshcon", []string{"internal/termsafe"}, "a BMC's serial console over SSH (x/crypto/ssh): the BMC's banner and words in errors escaped where they enter"},
	{"ipmi/console", []string{"api", "internal/apierr"}, "machines' serial console sessions (viewers, one writer, scrollback) and ConsoleService: the link (ipmi/sol) and the audit are wired in by the appliance through interfaces it declares"},
	{"images", []string{"images", "internal/initramfs", "internal/sourcetree", "internal/elfroot"}, "the artifact catalog and the initramfs builders; a foreign architecture's host files come with their ELF closure resolved inside the unpacked root (internal/elfroot)"},
	{"images/osimage", []string{"images", "api", "store", "internal/apierr", "internal/paging", "internal/diskmap"}, "operating-system images: records in the store, their bytes in the catalog's content store (images), OSImageService, the raw view and its cached block map (images/blockmap, the map's wire format)"},
	{"images/blockmap", []string{"internal/diskmap"}, "an OS image's raw view and block map (go-qcow2reader inside): only the map's wire format of ours, which the agent reads too"},
	{"agent", []string{"agent", "api", "internal/apierr", "internal/nodeid", "internal/termsafe"}, "code that runs on a machine: api and its own packages"},
	{"agent/deploy", []string{"agent", "api", "internal/diskmap"}, "carries out a DeployPlan on the machine: agent/diskwrite for the image, the block map's wire format, the API; never the appliance's builder (images/blockmap)"},
	{"agent/commission", []string{"api"}, "runs commissioning tests on the machine with real tools: the commission plan's API only, nothing else of ours"},
	{"agent/erase", []string{"api"}, "erases a released machine's disks on the machine: the erase plan's API only, nothing else of ours (no store, boot, ipmi)"},
	{"agent/diskwrite", []string{"internal/diskmap"}, "writes an OS image's raw extents to a disk: the block map's wire format only, never the appliance's builder (images/blockmap) nor any other package of ours"},
	{"boot", []string{"boot", "api", "images", "internal/apierr", "internal/keyrate", "internal/lograte", "internal/termsafe"}, "network boot serves the image catalog; its per-client packet budgets are internal/keyrate tables"},
	{"deploy", []string{"deploy", "api"}, "the do DAG executor speaks the API"},
	{"rest", []string{"api", "internal/httpstream"}, "REST/JSON over the appliance's own gRPC server (vanguard, in process), its watches and the OpenAPI document"},
	{"web", []string{"web", "api", "internal/httpstream"}, "the rack's web page: embedded assets and a JSON gateway that calls the appliance's own gRPC API with the caller's token"},
	{"hypervisor", []string{"hypervisor", "api", "internal/apierr", "internal/paging", "internal/nodeid"}, "node side and appliance side of VMs, volumes and networks"},
	{"appliance", []string{"*"}, "the composition root: wires every component (never cmd or testsupport)"},
	{"appliance/audit", []string{"appliance/audit", "api", "auth", "store", "internal/apierr", "internal/paging", "internal/lograte", "internal/termsafe", "internal/watchstream"}, "a feature the composition root plugs in: the audit stream and AuditService; it takes the store and the machines' timeline through interfaces it declares (the caller through auth's resolution) and never imports the appliance"},
	{"appliance/backup", []string{"appliance/backup", "api", "store", "auth/pki", "ipmi/seal", "internal/apierr", "internal/progress"}, "a feature the composition root plugs in: the backup format, BackupService and Restore; it takes the store, the data directory's layout and the store openers through its Config and options (the CA and seal key file names from their owners) and never imports the appliance"},
	{"appliance/webhook", []string{"appliance/webhook", "api", "store", "internal/apierr", "internal/paging"}, "a feature the composition root plugs in: webhook receivers in the store, WebhookService and the dispatcher that posts CloudEvents to them; it takes the seal, the boot LAN's ranges and the metrics registry through its constructors and never imports the appliance"},
	{"appliance/metrics", []string{"appliance/metrics", "api", "store", "boot/connlimit", "boot/dhcp", "boot/dhcp6", "boot/http", "boot/tftp"}, "a feature the composition root plugs in: the Prometheus registry, health and readiness; it takes the store, the gRPC server and a run group through interfaces it declares and never imports the appliance"},
	{"cmd", []string{"*"}, "thin mains wire concrete types (never testsupport)"},
	{"testsupport", []string{"*"}, "simulators, fakes, lab helpers: anything but cmd"},
	{"bench", []string{"*"}, "benchmark programs: anything but cmd"},
	{"", []string{"*"}, "module-wide guard tests"},
}

// importExceptions are arrows the floors above would refuse, each with its
// reason. An exception that no file uses any more fails the test.
var importExceptions = []struct{ from, to, why string }{
	{"boot/dhcp", "store", "full-mode leases are records in the store (CAS per lease)"},
	{"boot/dhcp6", "store", "DHCPv6 leases are records in the store (CAS per lease), as DHCPv4's"},
	{"boot/http", "agent/cmdline", "the kernel command line the script writes is the one the agent parses: one contract"},
	{"hypervisor/appliance", "inventory/pool", "VM and volume placement reserves node capacity in the pool"},
	{"hypervisor/appliance", "store", "VM, volume and image records live in the store"},
	{"hypervisor/appliance", "internal/watchstream", "WatchBlockStorages and WatchVirtualMachines stream those records"},
	{"cmd/corral-lab", "testsupport/lab", "the virtual rack is test support run as a command; nothing shipped links it"},
}

// Nothing imports cmd (tests included); only tests, bench and the
// test-support tree itself import the test-support tree.
var (
	neverImported = []string{"cmd"}
	testOnly      = "testsupport"
)

func within(path, folder string) bool {
	return folder == "*" || path == folder || folder == "" || strings.HasPrefix(path, folder+"/")
}

func ruleFor(dir string) importRule {
	best := importRule{folder: "-"}
	for _, r := range importRules {
		if within(dir, r.folder) && (best.folder == "-" || len(r.folder) > len(best.folder)) {
			best = r
		}
	}
	return best
}

// checkImports walks root and returns one line per refused arrow, naming
// the importing file, and the exceptions no file used.
func checkImports(root string) (refused []string, unused []string, err error) {
	used := map[int]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		dir := filepath.ToSlash(filepath.Dir(rel))
		if dir == "." {
			dir = ""
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		isTest := strings.HasSuffix(name, "_test.go")
		rule := ruleFor(dir)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p != module && !strings.HasPrefix(p, module+"/") {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
			if within(to, dir) && dir != "" && ruleFor(to).folder == rule.folder {
				continue // its own folder (a sub-folder with a rule of its own is a neighbour)
			}
			ok := false
			for _, n := range neverImported {
				if within(to, n) {
					refused = append(refused, fmt.Sprintf("%s imports %s: nothing imports cmd/ (move what it needs out of cmd)", rel, to))
					ok = true // reported
				}
			}
			if ok {
				continue
			}
			if isTest {
				// A test may wire real parts from anywhere below the
				// mains: real stores, the CA, the whole appliance
				// in-process, the test-support tree.
				continue
			}
			if within(to, testOnly) {
				if within(dir, testOnly) || within(dir, "bench") {
					continue
				}
			} else if slices.ContainsFunc(rule.may, func(m string) bool { return within(to, m) }) {
				continue
			}
			excepted := false
			for k, e := range importExceptions {
				if within(dir, e.from) && within(to, e.to) {
					used[k], excepted = true, true
				}
			}
			if !excepted {
				refused = append(refused, fmt.Sprintf("%s imports %s: %s/ may import %v (%s); add a reasoned exception or move the code", rel, to, rule.folder, rule.may, rule.why))
			}
		}
		return nil
	})
	for k, e := range importExceptions {
		if !used[k] {
			unused = append(unused, fmt.Sprintf("%s → %s (%s)", e.from, e.to, e.why))
		}
	}
	sort.Strings(refused)
	return refused, unused, err
}

// TestImportTable: every Go file's imports of Corral's own packages follow
// the table; a new arrow fails with the importing file named.
func TestImportTable(t *testing.T) {
	refused, unused, err := checkImports(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refused {
		t.Error(r)
	}
	for _, u := range unused {
		t.Errorf("stale import exception, no file uses it: %s", u)
	}
}

// TestImportTableRefuses proves the checker can fail: an upward and a
// sideways arrow in a scratch tree are reported with their files.
func TestImportTableRefuses(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("inventory/bad.go", "package inventory\nimport _ \""+module+"/boot/tftp\"\n")
	write("inventory/back.go", "package inventory\nimport _ \""+module+"/inventory/bmc\"\n")
	write("store/up.go", "package store\nimport _ \""+module+"/cmd/corrald\"\n")
	write("agent/ok_test.go", "package agent\nimport _ \""+module+"/testsupport/require\"\n")
	write("agent/prod.go", "package agent\nimport _ \""+module+"/testsupport/require\"\n")
	refused, _, err := checkImports(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"agent/prod.go imports testsupport/require", "inventory/back.go imports inventory/bmc", "inventory/bad.go imports boot/tftp", "store/up.go imports cmd/corrald"}
	if len(refused) != len(want) {
		t.Fatalf("refused %q, want %d lines", refused, len(want))
	}
	for k, w := range want {
		if !strings.HasPrefix(refused[k], w) {
			t.Errorf("line %d: %q, want prefix %q", k, refused[k], w)
		}
	}
}
