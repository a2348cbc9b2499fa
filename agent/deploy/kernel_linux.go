package deploy

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// reread asks the kernel to re-read dev's partition table (BLKRRPART),
// retrying while it says busy.
func reread(dev string) error {
	f, err := os.Open(dev)
	if err != nil {
		return fmt.Errorf("re-read partition table: %w", err)
	}
	defer f.Close()
	for i := 0; ; i++ {
		err = unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || i == 10 {
			return fmt.Errorf("re-read partition table of %s (BLKRRPART): %w", dev, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
