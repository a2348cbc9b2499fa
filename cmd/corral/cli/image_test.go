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

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// More behaviour of the fakes of fakes_test.go: the image verbs.

// debianImage is the image the fake image verbs answer with.
func debianImage() *deploymentv1.Image {
	return &deploymentv1.Image{
		Name: "debian",
		RegisteredBlockStorages: []*deploymentv1.Image_RegisteredBlockStorage{
			{BlockStorageName: "debian-12"}, {BlockStorageName: "debian-11"},
		},
		Tags: map[string]string{"latest": "debian-12", "12": "debian-12", "11": "debian-11"},
	}
}

func (f fakeImages) GetImage(_ context.Context, req *deploymentv1.GetImageRequest) (*deploymentv1.Image, error) {
	if err := f.r.record("GetImage", req); err != nil {
		return nil, err
	}
	if req.GetName() != "debian" {
		return nil, notFound()
	}
	return debianImage(), nil
}

func (f fakeImages) DeleteImage(_ context.Context, req *deploymentv1.DeleteImageRequest) (*emptypb.Empty, error) {
	if err := f.r.record("DeleteImage", req); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

func (f fakeImages) RegisterBlockStorage(_ context.Context, req *deploymentv1.RegisterBlockStorageRequest) (*deploymentv1.Image, error) {
	if err := f.r.record("RegisterBlockStorage", req); err != nil {
		return nil, err
	}
	return debianImage(), nil
}

func (f fakeImages) UnregisterBlockStorage(_ context.Context, req *deploymentv1.UnregisterBlockStorageRequest) (*deploymentv1.Image, error) {
	if err := f.r.record("UnregisterBlockStorage", req); err != nil {
		return nil, err
	}
	return debianImage(), nil
}

func (f fakeImages) TagImage(_ context.Context, req *deploymentv1.TagImageRequest) (*deploymentv1.Image, error) {
	if err := f.r.record("TagImage", req); err != nil {
		return nil, err
	}
	return debianImage(), nil
}

func (f fakeImages) UntagImage(_ context.Context, req *deploymentv1.UntagImageRequest) (*deploymentv1.Image, error) {
	if err := f.r.record("UntagImage", req); err != nil {
		return nil, err
	}
	return debianImage(), nil
}

func (f fakeImages) GenerateBlockStorage(_ context.Context, req *deploymentv1.GenerateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	if err := f.r.record("GenerateBlockStorage", req); err != nil {
		return nil, err
	}
	return &provisioningv1.BlockStorage{Name: req.GetBlockStorageName(), State: provisioningv1.BlockStorage_AVAILABLE, NodeName: "n1",
		RequestBytes: 2 << 30, LimitBytes: 2 << 30}, nil
}

const debianTable = `NAME     TAGS                                         REGISTERED
debian   11=debian-11,12=debian-12,latest=debian-12   debian-11,debian-12
`

func TestImageVerbs(t *testing.T) {
	runVerbCases(t, map[string]verbCase{
		"apply": {
			args:   []string{"image", "apply", "debian", "--annotation", "source=debian.org", "--label", "os=linux"},
			want:   []proto.Message{&deploymentv1.ApplyImageRequest{Name: "debian", Annotations: map[string]string{"source": "debian.org"}, Labels: map[string]string{"os": "linux"}}},
			stdout: "NAME     TAGS   REGISTERED\ndebian   -      -\n",
		},
		"apply plain json": {
			args:   []string{"images", "apply", "debian", "-o", "json"},
			want:   []proto.Message{&deploymentv1.ApplyImageRequest{Name: "debian"}},
			stdout: "{\n  \"name\": \"debian\"\n}\n",
		},
		"delete": {
			args:   []string{"image", "delete", "debian"},
			want:   []proto.Message{&deploymentv1.DeleteImageRequest{Name: "debian"}},
			stdout: "image/debian deleted\n",
		},
		"register with tags": {
			args:   []string{"image", "register", "debian", "debian-12", "--tag", "latest", "--tag", "12"},
			want:   []proto.Message{&deploymentv1.RegisterBlockStorageRequest{ImageName: "debian", BlockStorageName: "debian-12", Tags: []string{"latest", "12"}}},
			stdout: debianTable,
		},
		"register plain": {
			args: []string{"image", "register", "debian", "debian-12"},
			want: []proto.Message{&deploymentv1.RegisterBlockStorageRequest{ImageName: "debian", BlockStorageName: "debian-12"}},
		},
		"unregister": {
			args:   []string{"image", "unregister", "debian", "debian-11", "-o", "yaml"},
			want:   []proto.Message{&deploymentv1.UnregisterBlockStorageRequest{ImageName: "debian", BlockStorageName: "debian-11"}},
			wantIn: "- block_storage_name: debian-11\n",
		},
		"tag": {
			args: []string{"image", "tag", "debian", "stable", "debian-12"},
			want: []proto.Message{&deploymentv1.TagImageRequest{Name: "debian", Tag: "stable", RegisteredBlockStorageName: "debian-12"}},
		},
		"untag": {
			args: []string{"image", "untag", "debian", "11"},
			want: []proto.Message{&deploymentv1.UntagImageRequest{Name: "debian", Tag: "11"}},
		},
		"generate": {
			args: []string{"image", "generate", "debian", "latest", "web1-root", "--limit-bytes", "20GiB", "--request-bytes", "5GiB", "--annotation", "corral/expires_at=2030-01-01T00:00:00Z", "--label", "app=web"},
			want: []proto.Message{&deploymentv1.GenerateBlockStorageRequest{
				ImageName: "debian", Tag: "latest", BlockStorageName: "web1-root", RequestBytes: 5 << 30, LimitBytes: 20 << 30,
				Annotations: map[string]string{"corral/expires_at": "2030-01-01T00:00:00Z"}, Labels: map[string]string{"app": "web"},
			}},
			stdout: "NAME        STATE       NODE   SIZE   USED-BY\nweb1-root   AVAILABLE   n1     2GiB   -\n",
		},
		"generate source sizes": {
			args: []string{"image", "generate", "debian", "latest", "web1-root"},
			want: []proto.Message{&deploymentv1.GenerateBlockStorageRequest{ImageName: "debian", Tag: "latest", BlockStorageName: "web1-root"}},
		},
		"get image": {
			args:   []string{"get", "image", "debian"},
			want:   []proto.Message{&deploymentv1.GetImageRequest{Name: "debian"}},
			stdout: debianTable,
		},
	})
}

func TestImageBadInput(t *testing.T) {
	runBadCases(t, map[string]badCase{
		"register one arg":      {[]string{"image", "register", "debian"}, ExitUsage, "wrong number of arguments"},
		"tag two args":          {[]string{"image", "tag", "debian", "latest"}, ExitUsage, "wrong number of arguments"},
		"untag three args":      {[]string{"image", "untag", "debian", "a", "b"}, ExitUsage, "wrong number of arguments"},
		"generate bad size":     {[]string{"image", "generate", "debian", "latest", "x", "--limit-bytes", "1e9"}, ExitUsage, "--limit-bytes"},
		"generate no node flag": {[]string{"image", "generate", "debian", "latest", "x", "--node", "n1"}, ExitUsage, "unknown flag: --node"},
		"apply bad annotation":  {[]string{"image", "apply", "debian", "--annotation", "x"}, ExitUsage, "want KEY=VALUE"},
		"apply bad output":      {[]string{"image", "apply", "debian", "-o", "toml"}, ExitUsage, "unknown output format"},
		"missing verb":          {[]string{"image"}, ExitUsage, "missing image verb"},
		"get image unknown":     {[]string{"describe", "image", "nope"}, ExitError, `image "nope": not found (NotFound)`},
	})
}

func TestImageServerErrors(t *testing.T) {
	for method, args := range map[string][]string{
		"ApplyImage":             {"image", "apply", "debian"},
		"DeleteImage":            {"image", "delete", "debian"},
		"RegisterBlockStorage":   {"image", "register", "debian", "debian-12"},
		"UnregisterBlockStorage": {"image", "unregister", "debian", "debian-12"},
		"TagImage":               {"image", "tag", "debian", "latest", "debian-12"},
		"UntagImage":             {"image", "untag", "debian", "latest"},
		"GenerateBlockStorage":   {"image", "generate", "debian", "latest", "web1-root"},
	} {
		t.Run(method, func(t *testing.T) {
			s := newTestServer(t)
			s.fail[method] = status.Error(codes.FailedPrecondition, "block storage \"debian-12\" is IN_USE\nby virtual machine \"vm1\"")
			r := s.run(t, "", nil, args...)
			if r.code != ExitError || r.stdout != "" {
				t.Fatalf("exit %d, stdout %q", r.code, r.stdout)
			}
			checkOneLine(t, r.stderr)
			if !strings.Contains(r.stderr, `image "debian"`) || !strings.HasSuffix(r.stderr, `: block storage "debian-12" is IN_USE by virtual machine "vm1" (FailedPrecondition)`+"\n") {
				t.Errorf("stderr %q", r.stderr)
			}
		})
	}
}

func TestImageTable(t *testing.T) {
	var b strings.Builder
	if err := printRecords(&b, imageKind, []proto.Message{debianImage(), &deploymentv1.Image{Name: "empty"}}, true, formatTable); err != nil {
		t.Fatal(err)
	}
	want := `NAME     TAGS                                         REGISTERED
debian   11=debian-11,12=debian-12,latest=debian-12   debian-11,debian-12
empty    -                                            -
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}
