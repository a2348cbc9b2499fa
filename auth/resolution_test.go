package auth

import (
	"context"
	"strings"
	"testing"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestResolution: an interceptor running before the Interceptor learns
// who called through a Resolution, also for calls the Interceptor refuses.
func TestResolution(t *testing.T) {
	tk, _, _ := newTestTokens(t)
	tk.Now = nil
	viewer := mustCreate(t, tk, authv1.Role_ROLE_VIEWER, "", 0)
	viewerID, _ := parseToken(viewer)
	operator := mustCreate(t, tk, authv1.Role_ROLE_OPERATOR, "", 0)
	operatorID, _ := parseToken(operator)
	// A well-formed token that was never created: its id is claimed.
	forged := TokenPrefix + "00112233445566ff_" + strings.Repeat("a", secretLen)
	forgedID, forgedOK := parseToken(forged)
	ic := &Interceptor{Tokens: tk, files: testFiles(t)}

	type want struct {
		Code    codes.Code
		OK      bool
		Role    authv1.Role
		ID      string
		Claimed string
	}
	tests := map[string]struct {
		header string
		method string
		want   want
	}{
		"allowed":           {header: "Bearer " + operator, method: "/test.bare.v1.Bare/Guarded", want: want{Code: codes.OK, OK: true, Role: authv1.Role_ROLE_OPERATOR, ID: operatorID}},
		"permission denied": {header: "Bearer " + viewer, method: "/test.bare.v1.Bare/Guarded", want: want{Code: codes.PermissionDenied, OK: true, Role: authv1.Role_ROLE_VIEWER, ID: viewerID}},
		"unknown token":     {header: "Bearer " + forged, method: "/test.bare.v1.Bare/Guarded", want: want{Code: codes.Unauthenticated, Claimed: forgedID}},
		"malformed header":  {header: "Basic x", method: "/test.bare.v1.Bare/Guarded", want: want{Code: codes.Unauthenticated}},
		"no header":         {method: "/test.bare.v1.Bare/Guarded", want: want{Code: codes.Unauthenticated}},
	}
	if !forgedOK {
		t.Fatalf("forged token %q does not parse", forged)
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, kind := range []string{"unary", "stream"} {
				ctx := context.Background()
				if tc.header != "" {
					ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", tc.header))
				}
				ctx, res := WithResolution(ctx)
				var err error
				if kind == "unary" {
					_, err = ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: tc.method},
						func(context.Context, any) (any, error) { return nil, nil })
				} else {
					err = ic.Stream()(nil, fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: tc.method},
						func(any, grpc.ServerStream) error { return nil })
				}
				p, ok := res.Principal()
				got := want{Code: status.Code(err), OK: ok, Role: p.Role, ID: p.ID, Claimed: res.ClaimedTokenID()}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", kind, diff)
				}
			}
		})
	}
}
