// Package tpmid is the appliance's side of a machine's TPM 2.0 identity:
// it turns an endorsement key (EK) that an agent names into a verified
// identity by credential activation (TCG TPM 2.0 Part 1, "Credential
// Protection"), and optionally checks the EK's certificate against the
// TPM manufacturers' CAs an operator configured.
//
// An agent sends the EK's public key (its certificate, when the TPM holds
// one) and an attestation key (AK) its TPM made, with the TPM's signed
// statement that it made it. Verifier.Begin checks that the AK is a
// restricted signing key the TPM generated and cannot export, and makes a
// challenge: a random secret sealed by TPM2_MakeCredential to that EK and
// that AK's name. Only the TPM that holds the EK's private key, holding
// that AK too, can release the secret (TPM2_ActivateCredential).
// Verifier.Finish compares what the agent returns; a match proves the
// machine holds the EK, and the EK's identity (Identity: SHA-256 of its
// PKIX DER, hex) is what an inventory record binds.
//
// Challenges are bound to the caller and boot MAC that asked, good once,
// expire (DefaultTTL), and their table is bounded (DefaultMaxOutstanding);
// they live in this appliance's memory only.
//
// The TPM structures are read and made by go-attestation (and go-tpm
// beneath it); nothing here encodes TPM commands by hand. This package
// imports the generated API and the error classes, nothing else of ours.
package tpmid
