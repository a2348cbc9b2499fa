//go:debug x509keypairleaf=0

// The images' gobusybox build links corral-node under an older go
// directive, where tls.X509KeyPair leaves Certificate.Leaf nil; this
// package's tests run the same way so a Leaf dereference fails here first.
package node
