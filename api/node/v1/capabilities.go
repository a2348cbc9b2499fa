package nodev1

// Capabilities an agent names in RegisterRequest.capabilities.
const (
	// CapabilityKexec: the agent carries out KexecPlan after a successful
	// install (agent/kexec).
	CapabilityKexec = "kexec"
)
