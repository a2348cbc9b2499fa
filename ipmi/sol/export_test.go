package sol

// KeepaliveWait is keepaliveWait, for the external tests.
var KeepaliveWait = keepaliveWait
