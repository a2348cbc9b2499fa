package appliance

import (
	"context"
	"strings"
	"testing"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
)

func TestBlockStorageLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	bs := e.mkBS(t, "disk1", "n1")
	want := &provisioningv1.BlockStorage{
		Name: "disk1", RequestBytes: gib, LimitBytes: 2 * gib, State: bsAvailable, NodeName: "n1", StorageName: "disk1",
		Annotations: map[string]string{
			AnnotationBlockStorageRequestNode: "n1",
			AnnotationBlockStorageURL:         "file:///var/lib/corral/volumes/disk1.qcow2",
		},
	}
	if d := cmp.Diff(want, bs, protocmp.Transform()); d != "" {
		t.Fatalf("created (-want +got):\n%s", d)
	}
	if v := e.nodes["n1"].Volume("disk1"); v == nil || v.GetSizeBytes() != 2*gib {
		t.Fatalf("node volume = %v, want 2 GiB", v)
	}
	n1, _ := e.pool.GetNode(ctx, "n1")
	if st := n1.GetReservedStorages()["disk1"]; st.GetRequestBytes() != gib || st.GetAnnotations()[AnnotationBlockStorageReservedBy] != "disk1" {
		t.Fatalf("reservation = %v", st)
	}

	// Without request_node_name the pool schedules it.
	sched, err := e.bs.CreateBlockStorage(ctx, &provisioningv1.CreateBlockStorageRequest{Name: "disk2", RequestBytes: gib, LimitBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	if sched.GetNodeName() == "" || e.nodes[sched.GetNodeName()].Volume("disk2") == nil {
		t.Fatalf("scheduled onto %q without a volume there", sched.GetNodeName())
	}
	l, err := e.bs.ListBlockStorages(ctx, &provisioningv1.ListBlockStoragesRequest{})
	if err != nil || len(l.GetBlockStorages()) != 2 {
		t.Fatalf("list = %v, %v", l, err)
	}

	// Resize: budget and node volume grow; labels and user annotations
	// replaced, system annotations kept.
	up, err := e.bs.UpdateBlockStorage(ctx, &provisioningv1.UpdateBlockStorageRequest{
		Name: "disk1", RequestBytes: 2 * gib, LimitBytes: 4 * gib, Labels: map[string]string{"team": "a"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if up.GetLimitBytes() != 4*gib || up.GetState() != bsAvailable || up.GetLabels()["team"] != "a" || up.GetAnnotations()[AnnotationBlockStorageURL] == "" {
		t.Fatalf("updated = %v", up)
	}
	if v := e.nodes["n1"].Volume("disk1"); v.GetSizeBytes() != 4*gib {
		t.Fatalf("node volume size %d after resize", v.GetSizeBytes())
	}
	n1, _ = e.pool.GetNode(ctx, "n1")
	if st := n1.GetReservedStorages()["disk1"]; st.GetLimitBytes() != 4*gib || st.GetRequestBytes() != 2*gib {
		t.Fatalf("reservation after resize = %v", st)
	}
	_, err = e.bs.UpdateBlockStorage(ctx, &provisioningv1.UpdateBlockStorageRequest{Name: "disk1", LimitBytes: 3 * gib})
	wantCode(t, err, codes.InvalidArgument, "shrinking")

	// A failed resize on the node restores the old budget.
	e.nodes["n1"].FailOn("ResizeVolume", status.Error(codes.ResourceExhausted, "disk full"))
	_, err = e.bs.UpdateBlockStorage(ctx, &provisioningv1.UpdateBlockStorageRequest{Name: "disk1", LimitBytes: 8 * gib})
	wantCode(t, err, codes.ResourceExhausted, "disk full")
	e.nodes["n1"].FailOn("ResizeVolume", nil)
	n1, _ = e.pool.GetNode(ctx, "n1")
	if st := n1.GetReservedStorages()["disk1"]; st.GetLimitBytes() != 4*gib {
		t.Fatalf("reservation after failed resize = %v, want the old 4 GiB", st)
	}
	if e.bsState(t, "disk1") != bsAvailable {
		t.Fatalf("state after failed resize = %v", e.bsState(t, "disk1"))
	}

	// Purge needs DELETED; Delete/Undelete/Delete/Purge.
	_, err = e.bs.PurgeBlockStorage(ctx, &provisioningv1.PurgeBlockStorageRequest{Name: "disk1"})
	wantCode(t, err, codes.FailedPrecondition, "DELETED")
	if d, err := e.bs.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: "disk1"}); err != nil || d.GetState() != bsDeleted {
		t.Fatalf("delete = %v, %v", d, err)
	}
	if d, err := e.bs.UndeleteBlockStorage(ctx, &provisioningv1.UndeleteBlockStorageRequest{Name: "disk1"}); err != nil || d.GetState() != bsAvailable {
		t.Fatalf("undelete = %v, %v", d, err)
	}
	_, err = e.bs.UndeleteBlockStorage(ctx, &provisioningv1.UndeleteBlockStorageRequest{Name: "disk1"})
	wantCode(t, err, codes.FailedPrecondition, "AVAILABLE")
	if _, err := e.bs.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: "disk1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.bs.PurgeBlockStorage(ctx, &provisioningv1.PurgeBlockStorageRequest{Name: "disk1"}); err != nil {
		t.Fatal(err)
	}
	e.assertBSGone(t, "disk1")

	_, err = e.bs.DownloadBlockStorage(ctx, &provisioningv1.DownloadBlockStorageRequest{Name: "disk2"})
	wantCode(t, err, codes.FailedPrecondition, "not supported yet")
	_, err = e.bs.GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: "nope"})
	wantCode(t, err, codes.NotFound, "nope")
}

func TestBlockStorageBadInput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "exists", "n1")
	cases := map[string]struct {
		req      *provisioningv1.CreateBlockStorageRequest
		code     codes.Code
		contains string
	}{
		"no name":          {&provisioningv1.CreateBlockStorageRequest{RequestBytes: 1, LimitBytes: 1}, codes.InvalidArgument, "name"},
		"slash in name":    {&provisioningv1.CreateBlockStorageRequest{Name: "a/b", RequestBytes: 1, LimitBytes: 1}, codes.InvalidArgument, "malformed"},
		"zero request":     {&provisioningv1.CreateBlockStorageRequest{Name: "x", LimitBytes: 1}, codes.InvalidArgument, "request_bytes"},
		"request > limit":  {&provisioningv1.CreateBlockStorageRequest{Name: "x", RequestBytes: 2, LimitBytes: 1}, codes.InvalidArgument, "request_bytes 2 > limit_bytes 1"},
		"system key":       {&provisioningv1.CreateBlockStorageRequest{Name: "x", RequestBytes: 1, LimitBytes: 1, Annotations: map[string]string{AnnotationUsedBy: "x"}}, codes.InvalidArgument, "set by the system"},
		"bad expiry":       {&provisioningv1.CreateBlockStorageRequest{Name: "x", RequestBytes: 1, LimitBytes: 1, Annotations: map[string]string{AnnotationExpiresAt: "tomorrow"}}, codes.InvalidArgument, "RFC 3339"},
		"unknown node":     {&provisioningv1.CreateBlockStorageRequest{Name: "x", RequestBytes: 1, LimitBytes: 1, Annotations: map[string]string{AnnotationBlockStorageRequestNode: "n9"}}, codes.NotFound, "n9"},
		"too big":          {&provisioningv1.CreateBlockStorageRequest{Name: "x", RequestBytes: 500 * gib, LimitBytes: 500 * gib}, codes.ResourceExhausted, "no READY node fits"},
		"exists":           {&provisioningv1.CreateBlockStorageRequest{Name: "exists", RequestBytes: 1, LimitBytes: 1}, codes.AlreadyExists, "exists"},
		"node create fail": {&provisioningv1.CreateBlockStorageRequest{Name: "x", RequestBytes: 1, LimitBytes: 1, Annotations: map[string]string{AnnotationBlockStorageRequestNode: "n2"}}, codes.Unavailable, "n2"},
	}
	e.nodes["n2"].SetDown(true)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := e.bs.CreateBlockStorage(ctx, tc.req)
			wantCode(t, err, tc.code, tc.contains)
			if tc.req.GetName() == "x" {
				e.assertBSGone(t, "x")
			}
		})
	}
}

func TestFetchBlockStorage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const sum = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	nodeErrs := map[string]error{
		// The codes hypervisor/node gives: ErrFetch and ErrChecksum are
		// FailedPrecondition, ErrTooLarge ResourceExhausted.
		"http://img/404.qcow2":   status.Error(codes.FailedPrecondition, "fetch failed: GET http://img/404.qcow2: 404 Not Found"),
		"http://img/big.qcow2":   status.Error(codes.ResourceExhausted, "download exceeds max_bytes 2147483648"),
		"http://img/sum.qcow2":   status.Error(codes.FailedPrecondition, "checksum mismatch: http://img/sum.qcow2 has sha256 00ff, want "+sum),
		"http://img/slow.qcow2":  status.Error(codes.DeadlineExceeded, "download timed out after 60s"),
		"https://img/ok.qcow2":   nil,
		"https://img/fine.qcow2": nil,
	}
	e.nodes["n1"].OnFetch(func(r *hypervisorv1.FetchVolumeRequest) error { return nodeErrs[r.GetSourceUrl()] })
	cases := map[string]struct {
		url, sha string
		code     codes.Code
		contains string
	}{
		"ok":             {"https://img/ok.qcow2", sum, codes.OK, ""},
		"404":            {"http://img/404.qcow2", "", codes.FailedPrecondition, `node "n1": fetch http://img/404.qcow2: fetch failed: GET http://img/404.qcow2: 404 Not Found`},
		"too large":      {"http://img/big.qcow2", "", codes.ResourceExhausted, "exceeds max_bytes"},
		"wrong checksum": {"http://img/sum.qcow2", sum, codes.FailedPrecondition, "has sha256 00ff, want " + sum},
		"timeout":        {"http://img/slow.qcow2", "", codes.Unavailable, "timed out"},
		"ftp refused":    {"ftp://img/x", "", codes.InvalidArgument, "http or https"},
		"relative":       {"/x.qcow2", "", codes.InvalidArgument, "http or https"},
		"bad sha":        {"https://img/fine.qcow2", "abc", codes.InvalidArgument, "64 hexadecimal"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			bsName := "f-" + strings.ReplaceAll(name, " ", "-")
			bs, err := e.bs.FetchBlockStorage(ctx, &provisioningv1.FetchBlockStorageRequest{
				Name: bsName, RequestBytes: gib, LimitBytes: 2 * gib, SourceUrl: tc.url, SourceSha256: tc.sha,
				Annotations: map[string]string{AnnotationBlockStorageRequestNode: "n1"},
			})
			if tc.code != codes.OK {
				wantCode(t, err, tc.code, tc.contains)
				e.assertBSGone(t, bsName)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if bs.GetAnnotations()[AnnotationFetchFrom] != tc.url || bs.GetState() != bsAvailable {
				t.Fatalf("fetched = %v", bs)
			}
			var got *hypervisorv1.FetchVolumeRequest
			for _, c := range e.nodes["n1"].Calls() {
				if r, ok := c.Request.(*hypervisorv1.FetchVolumeRequest); ok && r.GetName() == bsName {
					got = r
				}
			}
			if got.GetMaxBytes() != 2*gib || got.GetSha256() != sum || got.GetTimeoutSeconds() == 0 {
				t.Fatalf("FetchVolume request = %v", got)
			}
		})
	}
}

func TestCopyBlockStorage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "base", "n1")
	cp, err := e.bs.CopyBlockStorage(ctx, &provisioningv1.CopyBlockStorageRequest{Name: "copy", SourceBlockStorage: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if cp.GetNodeName() != "n1" || cp.GetLimitBytes() != 2*gib || cp.GetAnnotations()[AnnotationCopyFrom] != "base" {
		t.Fatalf("copy = %v", cp)
	}
	if v := e.nodes["n1"].Volume("copy"); v.GetBackingFile() != "/var/lib/corral/volumes/base.qcow2" {
		t.Fatalf("copy volume = %v, want a backing file", v)
	}
	// The source is now a backing file: not attachable, not purgeable.
	_, err = e.vm.CreateVirtualMachine(ctx, vmReq("vm1", "base"))
	wantCode(t, err, codes.FailedPrecondition, "backs copy")
	e.assertVMGone(t, "vm1")
	if _, err := e.bs.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: "base"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.bs.PurgeBlockStorage(ctx, &provisioningv1.PurgeBlockStorageRequest{Name: "base"})
	wantCode(t, err, codes.FailedPrecondition, "backs copy")

	// Cross-node copies are refused clearly.
	_, err = e.bs.CopyBlockStorage(ctx, &provisioningv1.CopyBlockStorageRequest{Name: "copy2", SourceBlockStorage: "copy",
		Annotations: map[string]string{AnnotationBlockStorageRequestNode: "n2"}})
	wantCode(t, err, codes.FailedPrecondition, "across nodes are not supported")
	_, err = e.bs.CopyBlockStorage(ctx, &provisioningv1.CopyBlockStorageRequest{Name: "copy3", SourceBlockStorage: "missing"})
	wantCode(t, err, codes.NotFound, "missing")

	// Purging the copy releases the hold; then the source purges.
	for _, n := range []string{"copy", "base"} {
		if n == "copy" {
			if _, err := e.bs.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: n}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.bs.PurgeBlockStorage(ctx, &provisioningv1.PurgeBlockStorageRequest{Name: n}); err != nil {
			t.Fatalf("purge %s: %v", n, err)
		}
		e.assertBSGone(t, n)
	}
}
