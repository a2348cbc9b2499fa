// Package session is the agent's client of the appliance's AgentService:
// a TLS connection that trusts the appliance CA pinned by its SHA-256
// fingerprint from the kernel command line (every appliance of a fleet
// shares that CA, and each connection is verified against the pin),
// Register with retries on the endpoints of the command line in order —
// the next one when an appliance refuses, does not answer or its session
// ends (exponential backoff with jitter after a whole round failed, the
// reason printed on the console at every attempt) —, then a Session
// stream that sends heartbeats and follows the appliance's commands
// (wait, power off, reboot, and install and wipe plans, which a
// Config.Installer carries out one at a time in the background while the
// session keeps heartbeating; their progress is delivered on whichever
// session is open, on whichever appliance; the appliance reboots the
// machine after "done", or the agent does with Config.InstallReboot).
// Deploy and erase plans run the same way through Config.Deployer and
// Config.Eraser (unsupported when nil); after a deploy whose plan says
// reboot, the agent reboots into the disk once its "written" progress
// went out on a session, or after Config.DeployRebootGrace when none
// carried it.
// An agent with a Config.Kexec names the "kexec" capability at Register
// and carries out the KexecPlan that follows an install it finished
// (refusing one for any other install), reporting a failure as a "kexec"
// progress error so the appliance reboots the machine the old way.
// An install's certificate request (for the node key the installer made
// on the machine) goes on the open session, again on each new session
// while unanswered, and its NodeCertificate is awaited for at most
// Config.CertificateTimeout.
//
// It imports only the API, agent/cmdline (the endpoint rules),
// internal/nodeid, grpc and the standard library; it must not import
// store/, boot/, ipmi/ or anything of the appliance.
package session
