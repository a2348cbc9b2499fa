// Package storecheck holds assertions over a whole store that several
// packages' tests make: that no secret (a password, a token) was written to
// any record or returned in an API answer. It is for tests only.
package storecheck

import (
	"bytes"
	"context"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/corralhq/corral/store"
)

// NoSecrets fails t when any of secrets (what → value) appears in a key or
// value of st, or in the JSON or wire encoding of one of answers. An empty
// secret fails at once: a test that lost its secret would otherwise pass.
func NoSecrets(t testing.TB, st store.Store, secrets map[string]string, answers ...proto.Message) {
	t.Helper()
	kvs, err := st.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	var dump bytes.Buffer
	for _, kv := range kvs {
		dump.WriteString(kv.Key)
		dump.Write(kv.Value)
	}
	for _, a := range answers {
		b, err := protojson.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		dump.Write(b)
		if b, err = proto.Marshal(a); err != nil {
			t.Fatal(err)
		}
		dump.Write(b)
	}
	for what, s := range secrets {
		if s == "" {
			t.Fatalf("secret %s is empty", what)
		}
		if bytes.Contains(dump.Bytes(), []byte(s)) {
			t.Errorf("the %s is in the store or an answer", what)
		}
	}
}
