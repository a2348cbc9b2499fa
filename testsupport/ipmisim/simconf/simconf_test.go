package simconf

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLANConfigAnswers runs the program as ipmi_sim does.
func TestLANConfigAnswers(t *testing.T) {
	prog := filepath.Join(t.TempDir(), "lanconfig")
	if err := os.WriteFile(prog, []byte(LANConfig{Addr: "10.9.0.7", Netmask: "255.255.255.0", MAC: "02:00:00:00:00:07"}.Script()), 0o755); err != nil {
		t.Fatal(err)
	}
	for param, want := range map[string]string{
		"ip_addr": "ip_addr:10.9.0.7", "subnet_mask": "subnet_mask:255.255.255.0", "mac_addr": "mac_addr:02:00:00:00:00:07",
		"default_gw_ip_addr": "default_gw_ip_addr:0.0.0.0", "ip_addr_src": "ip_addr_src:static",
	} {
		out, err := exec.Command(prog, "get", param).Output()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("get %s: %q %v, want %q", param, out, err, want)
		}
	}
}

func TestLANConfWithoutChassis(t *testing.T) {
	c := LAN{Name: "b", Port: 9000, GUID: "00", User: "u", Password: "p"}.Conf()
	if strings.Contains(c, "chassis_control") || !strings.Contains(c, `user 2 true "u" "p" admin`) {
		t.Fatalf("lan.conf:\n%s", c)
	}
}
