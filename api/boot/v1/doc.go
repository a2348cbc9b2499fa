// Package bootv1 is the generated corral.boot.v1 records of network boot
// (DHCP leases). Generated code lives beside this file (buf generate); it
// imports only protobuf.
package bootv1
