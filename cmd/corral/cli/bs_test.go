package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// More behaviour of the fakes of fakes_test.go: the block storage verbs.

// disk1 is what the fake GetBlockStorage serves.
func disk1() *provisioningv1.BlockStorage {
	return &provisioningv1.BlockStorage{
		Name: "disk1", State: provisioningv1.BlockStorage_AVAILABLE, NodeName: "n1",
		Annotations: map[string]string{
			"owner":                                 "alice",
			"n0core/provisioning/block_storage/url": "file:///var/lib/corral-node/volumes/disk1.qcow2",
		},
		Labels:       map[string]string{"tier": "gold"},
		RequestBytes: 10 << 30, LimitBytes: 20 << 30,
	}
}

func (f fakeBlockStorages) GetBlockStorage(_ context.Context, req *provisioningv1.GetBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	if err := f.r.record("GetBlockStorage", req); err != nil {
		return nil, err
	}
	if req.GetName() != "disk1" {
		return nil, notFound()
	}
	return disk1(), nil
}

func (f fakeBlockStorages) CopyBlockStorage(_ context.Context, req *provisioningv1.CopyBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	if err := f.r.record("CopyBlockStorage", req); err != nil {
		return nil, err
	}
	return &provisioningv1.BlockStorage{Name: req.GetName(), State: provisioningv1.BlockStorage_AVAILABLE, NodeName: "n1",
		RequestBytes: 10 << 30, LimitBytes: 20 << 30}, nil
}

func (f fakeBlockStorages) UpdateBlockStorage(_ context.Context, req *provisioningv1.UpdateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	if err := f.r.record("UpdateBlockStorage", req); err != nil {
		return nil, err
	}
	bs := disk1()
	if req.GetRequestBytes() != 0 {
		bs.RequestBytes = req.GetRequestBytes()
	}
	if req.GetLimitBytes() != 0 {
		bs.LimitBytes = req.GetLimitBytes()
	}
	return bs, nil
}

func (f fakeBlockStorages) UndeleteBlockStorage(_ context.Context, req *provisioningv1.UndeleteBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	if err := f.r.record("UndeleteBlockStorage", req); err != nil {
		return nil, err
	}
	return &provisioningv1.BlockStorage{Name: req.GetName(), State: provisioningv1.BlockStorage_AVAILABLE}, nil
}

func (f fakeBlockStorages) PurgeBlockStorage(_ context.Context, req *provisioningv1.PurgeBlockStorageRequest) (*emptypb.Empty, error) {
	if err := f.r.record("PurgeBlockStorage", req); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

const sum256 = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"

func TestBSVerbs(t *testing.T) {
	runVerbCases(t, map[string]verbCase{
		"create": {
			args: []string{"bs", "create", "data1", "--limit-bytes", "20GiB", "--request-bytes", "10G",
				"--node", "n2", "--annotation", "owner=bob", "--label", "tier=gold"},
			want: []proto.Message{&provisioningv1.CreateBlockStorageRequest{
				Name: "data1", RequestBytes: 10e9, LimitBytes: 20 << 30,
				Annotations: map[string]string{"owner": "bob", "n0core/provisioning/block_storage/request_node_name": "n2"},
				Labels:      map[string]string{"tier": "gold"},
			}},
			stdout: "NAME    STATE         NODE   SIZE   USED-BY\ndata1   UNSPECIFIED   -      0B     -\n",
		},
		"create request defaults to limit": {
			args: []string{"block-storage", "create", "data1", "--limit-bytes", "1TiB", "-o", "yaml"},
			want: []proto.Message{&provisioningv1.CreateBlockStorageRequest{
				Name: "data1", RequestBytes: 1 << 40, LimitBytes: 1 << 40,
			}},
			stdout: "name: data1\n",
		},
		"fetch": {
			args: []string{"bs", "fetch", "debian-12", "--url", "https://example.test/debian-12.qcow2",
				"--sha256", sum256, "--limit-bytes", "2GiB", "--request-bytes", "1GiB", "--node", "n1"},
			want: []proto.Message{&provisioningv1.FetchBlockStorageRequest{
				Name: "debian-12", RequestBytes: 1 << 30, LimitBytes: 2 << 30,
				SourceUrl: "https://example.test/debian-12.qcow2", SourceSha256: strings.ToLower(sum256),
				Annotations: map[string]string{"n0core/provisioning/block_storage/request_node_name": "n1"},
			}},
			wantIn: "debian-12 ",
		},
		"fetch without checksum": {
			args: []string{"bs", "fetch", "tiny", "--url", "http://10.0.0.1:8080/tiny.qcow2", "--limit-bytes", "100MiB"},
			want: []proto.Message{&provisioningv1.FetchBlockStorageRequest{
				Name: "tiny", RequestBytes: 100 << 20, LimitBytes: 100 << 20, SourceUrl: "http://10.0.0.1:8080/tiny.qcow2",
			}},
		},
		"copy": {
			args:   []string{"bs", "copy", "disk1", "disk2"},
			want:   []proto.Message{&provisioningv1.CopyBlockStorageRequest{Name: "disk2", SourceBlockStorage: "disk1"}},
			stdout: "NAME    STATE       NODE   SIZE          USED-BY\ndisk2   AVAILABLE   n1     10GiB/20GiB   -\n",
		},
		"copy bigger": {
			args: []string{"bs", "copy", "disk1", "disk2", "--limit-bytes", "40GiB", "--label", "k=v"},
			want: []proto.Message{&provisioningv1.CopyBlockStorageRequest{Name: "disk2", SourceBlockStorage: "disk1",
				RequestBytes: 40 << 30, LimitBytes: 40 << 30, Labels: map[string]string{"k": "v"}}},
		},
		"resize keeps annotations and labels": {
			args: []string{"bs", "resize", "disk1", "--limit-bytes", "30GiB"},
			want: []proto.Message{
				&provisioningv1.GetBlockStorageRequest{Name: "disk1"},
				&provisioningv1.UpdateBlockStorageRequest{Name: "disk1", Annotations: disk1().GetAnnotations(), Labels: disk1().GetLabels(), LimitBytes: 30 << 30},
			},
			stdout: "NAME    STATE       NODE   SIZE          USED-BY\ndisk1   AVAILABLE   n1     10GiB/30GiB   -\n",
		},
		"resize request only": {
			args: []string{"bs", "resize", "disk1", "--request-bytes", "20GiB", "-o", "json"},
			want: []proto.Message{
				&provisioningv1.GetBlockStorageRequest{Name: "disk1"},
				&provisioningv1.UpdateBlockStorageRequest{Name: "disk1", Annotations: disk1().GetAnnotations(), Labels: disk1().GetLabels(), RequestBytes: 20 << 30},
			},
			wantIn: `"request_bytes": "21474836480"`,
		},
		"delete": {
			args:   []string{"bs", "delete", "disk1"},
			want:   []proto.Message{&provisioningv1.DeleteBlockStorageRequest{Name: "disk1"}},
			stdout: "NAME    STATE     NODE   SIZE   USED-BY\ndisk1   DELETED   -      0B     -\n",
		},
		"undelete": {
			args:   []string{"bs", "undelete", "disk1"},
			want:   []proto.Message{&provisioningv1.UndeleteBlockStorageRequest{Name: "disk1"}},
			wantIn: "AVAILABLE",
		},
		"purge": {
			args:   []string{"bs", "purge", "disk1"},
			want:   []proto.Message{&provisioningv1.PurgeBlockStorageRequest{Name: "disk1"}},
			stdout: "block_storage/disk1 purged\n",
		},
		"describe bs": {
			args:   []string{"describe", "bs", "disk1"},
			want:   []proto.Message{&provisioningv1.GetBlockStorageRequest{Name: "disk1"}},
			wantIn: "  owner: alice\n",
		},
	})
}

func TestBSBadInput(t *testing.T) {
	runBadCases(t, map[string]badCase{
		"bad size":               {[]string{"bs", "create", "d", "--limit-bytes", "20 GiB"}, ExitUsage, "--limit-bytes"},
		"fractional bytes":       {[]string{"bs", "create", "d", "--limit-bytes", "1.5B"}, ExitUsage, "not a whole number of bytes"},
		"zero size":              {[]string{"bs", "create", "d", "--limit-bytes", "0"}, ExitUsage, "must be positive"},
		"missing limit":          {[]string{"bs", "create", "d", "--request-bytes", "1GiB"}, ExitUsage, `"limit-bytes" not set`},
		"fetch missing url":      {[]string{"bs", "fetch", "d", "--limit-bytes", "1GiB"}, ExitUsage, `"url" not set`},
		"fetch ftp url":          {[]string{"bs", "fetch", "d", "--url", "ftp://example.test/x.img", "--limit-bytes", "1GiB"}, ExitUsage, "http or https"},
		"fetch relative url":     {[]string{"bs", "fetch", "d", "--url", "/x.img", "--limit-bytes", "1GiB"}, ExitUsage, "http or https"},
		"fetch short sha256":     {[]string{"bs", "fetch", "d", "--url", "https://e.test/x", "--limit-bytes", "1GiB", "--sha256", "abc"}, ExitUsage, "64 hexadecimal digits"},
		"fetch bad size":         {[]string{"bs", "fetch", "d", "--url", "https://e.test/x", "--limit-bytes", "lots"}, ExitUsage, "--limit-bytes"},
		"copy one arg":           {[]string{"bs", "copy", "disk1"}, ExitUsage, "wrong number of arguments"},
		"resize nothing":         {[]string{"bs", "resize", "disk1"}, ExitUsage, "give --limit-bytes"},
		"resize zero":            {[]string{"bs", "resize", "disk1", "--limit-bytes", "0"}, ExitUsage, "must be positive"},
		"create node+annotation": {[]string{"bs", "create", "d", "--limit-bytes", "1GiB", "--node", "a", "--annotation", "n0core/provisioning/block_storage/request_node_name=b"}, ExitUsage, "contradicts"},
		"delete bad output":      {[]string{"bs", "delete", "disk1", "-o", "wide"}, ExitUsage, "unknown output format"},
		"unknown verb":           {[]string{"bs", "shred", "disk1"}, ExitUsage, `unknown bs verb "shred"`},
		"resize unknown":         {[]string{"bs", "resize", "nope", "--limit-bytes", "1GiB"}, ExitError, `resize block_storage "nope": not found (NotFound)`},
	})
}

func TestBSServerErrors(t *testing.T) {
	for method, args := range map[string][]string{
		"CreateBlockStorage":   {"bs", "create", "d9", "--limit-bytes", "1GiB"},
		"FetchBlockStorage":    {"bs", "fetch", "d9", "--url", "https://e.test/404", "--limit-bytes", "1GiB"},
		"CopyBlockStorage":     {"bs", "copy", "disk1", "d9"},
		"UpdateBlockStorage":   {"bs", "resize", "disk1", "--limit-bytes", "1TiB"},
		"DeleteBlockStorage":   {"bs", "delete", "d9"},
		"UndeleteBlockStorage": {"bs", "undelete", "d9"},
		"PurgeBlockStorage":    {"bs", "purge", "d9"},
	} {
		t.Run(method, func(t *testing.T) {
			s := newTestServer(t)
			s.fail[method] = status.Error(codes.InvalidArgument, "fetch https://e.test/404:\nHTTP 404 Not Found")
			r := s.run(t, "", nil, args...)
			if r.code != ExitError || r.stdout != "" {
				t.Fatalf("exit %d, stdout %q", r.code, r.stdout)
			}
			checkOneLine(t, r.stderr)
			if !strings.Contains(r.stderr, `block_storage "`) || !strings.Contains(r.stderr, ": fetch https://e.test/404: HTTP 404 Not Found (InvalidArgument)\n") {
				t.Errorf("stderr %q", r.stderr)
			}
		})
	}
}

func TestBSTable(t *testing.T) {
	bss := []proto.Message{
		&provisioningv1.BlockStorage{Name: "web1-root", State: provisioningv1.BlockStorage_IN_USE, NodeName: "n1",
			RequestBytes: 10 << 30, LimitBytes: 10 << 30, Annotations: map[string]string{annBSUsedBy: "web1"}},
		&provisioningv1.BlockStorage{Name: "debian-12", State: provisioningv1.BlockStorage_PROTECTED, NodeName: "n1",
			RequestBytes: 1 << 30, LimitBytes: 2 << 30, Annotations: map[string]string{
				annBSProtectedBy: "debian", annBSBackingForPref + "web1-root": "1", annBSBackingForPref + "db1-root": "1"}},
		&provisioningv1.BlockStorage{Name: "scratch", State: provisioningv1.BlockStorage_AVAILABLE, NodeName: "n2",
			RequestBytes: 1 << 30, LimitBytes: 100 << 30},
	}
	var b strings.Builder
	if err := printRecords(&b, blockStorageKind, bss, true, formatTable); err != nil {
		t.Fatal(err)
	}
	want := `NAME        STATE       NODE   SIZE          USED-BY
web1-root   IN_USE      n1     10GiB         vm/web1
debian-12   PROTECTED   n1     1GiB/2GiB     image/debian,copy/db1-root,copy/web1-root
scratch     AVAILABLE   n2     1GiB/100GiB   -
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}
