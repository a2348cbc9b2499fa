package nodev1

// Capabilities an agent names in RegisterRequest.capabilities.
const (
	// CapabilityKexec: the agent carries out KexecPlan after a successful
	// install (agent/kexec).
	CapabilityKexec = "kexec"
	// CapabilityKexecPrefetch: the agent also takes a KexecPlan while the
	// install it follows still runs: it fetches, verifies and loads the
	// files then, and reboots into them only on the KexecPlan sent after
	// the install's done (agent/kexec's Booter.Prefetch).
	CapabilityKexecPrefetch = "kexec-prefetch"
)
