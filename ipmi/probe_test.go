package ipmi

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/ipmisim"
)

// TestProbeIPMI: ipmi_sim answers the session-less probe; a bound port
// that never answers and a closed port do not count.
func TestProbeIPMI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if !testing.Short() {
		b := ipmisim.Start(t, ipmisim.Options{})
		if !probeIPMI(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))) {
			t.Fatal("ipmi_sim did not answer the probe")
		}
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	silent := pc.LocalAddr().String()
	short, cancel2 := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel2()
	if probeIPMI(short, silent) {
		t.Fatal("a silent port answered")
	}
	_ = pc.Close()
	if probeIPMI(ctx, silent) {
		t.Fatal("a closed port answered")
	}
}
