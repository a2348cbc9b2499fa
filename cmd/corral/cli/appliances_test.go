package cli

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corralhq/corral/api/clientconfig"
	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/fleet"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// fleetServer serves the real fleet.Service over bufconn on an in-memory
// store holding three appliances (a2 leads, a3 expired) and four
// assignments. Heartbeats are minutes old (the table shows ages against
// the real clock); the service judges liveness at the time of the newest.
func fleetServer(t *testing.T) func(*clientconfig.Config) (*grpc.ClientConn, error) {
	t.Helper()
	ctx := context.Background()
	st := mem.New()
	t.Cleanup(func() { st.Close() })
	base := time.Now().Add(-2 * time.Minute)
	for _, a := range []*fleetv1.Appliance{
		{Name: "a1", ApiEndpoint: "10.0.0.1:20180", Load: 1, LastHeartbeat: timestamppb.New(base)},
		{Name: "a2", ApiEndpoint: "10.0.0.2:20180", Load: 2, LastHeartbeat: timestamppb.New(base.Add(-time.Second))},
		{Name: "a3", Load: 5, LastHeartbeat: timestamppb.New(base.Add(-3 * time.Hour))},
	} {
		if _, err := record.Put(ctx, st, fleet.AppliancePrefix+a.GetName(), a, 0); err != nil {
			t.Fatal(err)
		}
	}
	for m, r := range map[string]string{"m0": "a1", "m1": "a2", "m2": "a2", "m3": "a3"} {
		if _, err := record.Put(ctx, st, fleet.AssignmentPrefix+m, &fleetv1.Assignment{Machine: m, Runner: r}, 0); err != nil {
			t.Fatal(err)
		}
	}
	srv := grpc.NewServer()
	fleet.Register(srv, &fleet.Service{Store: st, Now: func() time.Time { return base },
		Leader: func(context.Context) (string, error) { return "a2", nil }})
	lis := bufconn.Listen(1 << 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return func(*clientconfig.Config) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
}

func TestGetAppliances(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
		code int
	}{
		"table": {
			args: []string{"get", "appliances"},
			want: `NAME   ROLE      ENDPOINT         LOAD   ASSIGNED   LAST-HEARTBEAT
a1     RUNNER    10.0.0.1:20180   1      1          2m ago
a2     LEADER    10.0.0.2:20180   2      2          2m ago
a3     EXPIRED   -                5      1          3h ago
`,
		},
		"alias app, one": {
			args: []string{"get", "app", "a2"},
			want: `NAME   ROLE     ENDPOINT         LOAD   ASSIGNED   LAST-HEARTBEAT
a2     LEADER   10.0.0.2:20180   2      2          2m ago
`,
		},
		"json": {
			args: []string{"get", "appliance", "a3", "-o", "json"},
			want: `{
  "name": "a3",
  "last_heartbeat": "` + "X" + `",
  "load": 5,
  "role": "EXPIRED",
  "assigned": 1
}
`,
		},
		"yaml list": {
			args: []string{"get", "Appliances", "-o", "yaml"},
			want: `- api_endpoint: 10.0.0.1:20180
  assigned: 1
  last_heartbeat: "X"
  load: 1
  name: a1
  role: RUNNER
- api_endpoint: 10.0.0.2:20180
  assigned: 2
  last_heartbeat: "X"
  load: 2
  name: a2
  role: LEADER
- assigned: 1
  last_heartbeat: "X"
  load: 5
  name: a3
  role: EXPIRED
`,
		},
		"unknown appliance": {
			args: []string{"get", "appliance", "a9"},
			want: `corral: appliance "a9": no such appliance in the fleet (NotFound)` + "\n",
			code: ExitError,
		},
		"machine filters refused": {
			args: []string{"get", "appliances", "--state", "deployed"},
			want: "corral: --state, --serial, --mac and --selector filter the machine list only\n",
			code: ExitUsage,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := map[string]string{"HOME": t.TempDir(), envEndpoint: "bufnet:1"}
			app := &App{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
				Getenv: func(k string) string { return env[k] }, Dial: fleetServer(t)}
			code := app.Run(context.Background(), tt.args)
			if code != tt.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tt.code, stderr.String())
			}
			got := stdout.String()
			if tt.code != ExitOK {
				got = stderr.String()
			}
			if diff := cmp.Diff(tt.want, maskTimestamps(got)); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
		})
	}
}

// maskTimestamps replaces the RFC 3339 heartbeat times of JSON and YAML
// output (they follow the real clock) with X.
func maskTimestamps(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if j := strings.Index(l, `last_heartbeat": "`); j >= 0 {
			lines[i] = l[:j] + `last_heartbeat": "X",`
		} else if j := strings.Index(l, `last_heartbeat: "`); j >= 0 {
			lines[i] = l[:j] + `last_heartbeat: "X"`
		}
	}
	return strings.Join(lines, "\n")
}
