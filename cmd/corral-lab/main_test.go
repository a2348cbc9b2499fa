package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestDirSources: --dir comes from the command line, else CORRAL_DIR,
// else the older CORRAL_LAB_DIR.
func TestDirSources(t *testing.T) {
	base := t.TempDir()
	flagDir, envDir, aliasDir := filepath.Join(base, "flag"), filepath.Join(base, "env"), filepath.Join(base, "alias")
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"flag over env": {args: []string{"--dir", flagDir}, env: map[string]string{"CORRAL_DIR": envDir, "CORRAL_LAB_DIR": aliasDir}, want: flagDir},
		"env":           {env: map[string]string{"CORRAL_DIR": envDir, "CORRAL_LAB_DIR": aliasDir}, want: envDir},
		"alias":         {env: map[string]string{"CORRAL_LAB_DIR": aliasDir}, want: aliasDir},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("CORRAL_DIR", "")
			t.Setenv("CORRAL_LAB_DIR", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out, errOut bytes.Buffer
			err := run(context.Background(), append(tc.args, "status"), &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tc.want+": no lab here") {
				t.Fatalf("corral-lab status = %v, want the no-lab error for %s", err, tc.want)
			}
		})
	}
}
