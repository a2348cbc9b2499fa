package erase

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// device is an open disk (or, in tests, a regular file standing in for
// one).
type device interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
	// discard discards [off, off+n) (BLKDISCARD; a punched hole in a
	// file).
	discard(off, n int64) error
	// zeroout makes [off, off+n) read zero without sending the zeros
	// (BLKZEROOUT; fallocate's zero range in a file).
	zeroout(off, n int64) error
	// flush writes cached writes back and drops the cached pages, so the
	// next reads come from the medium.
	flush() error
	// reread asks the kernel to re-read the partition table (BLKRRPART).
	reread() error
	// nvmeNSID is the namespace ID of an NVMe namespace device.
	nvmeNSID() (uint32, error)
	// nvmeAdmin sends an NVMe admin command, through the controller's
	// device where there is one, with data as its buffer (in or out,
	// cmd.dataLen bytes). status is the controller's status field
	// (0: success); err an ioctl failure.
	nvmeAdmin(cmd *nvmeCommand, data []byte) (status uint32, err error)
	// ataIdentify reads the 512-byte ATA IDENTIFY DEVICE data.
	ataIdentify() ([]byte, error)
	// ataPassThrough sends an ATA PASS-THROUGH (16) CDB through SG_IO with
	// data written to the device (nil: no data).
	ataPassThrough(cdb []byte, data []byte, timeout time.Duration) error
}

// unixStat is what statDev finds.
type unixStat struct {
	block bool
	char  bool
	devno string // "major:minor" of a device node
}

func statDev(path string, st *unixStat) error {
	var s unix.Stat_t
	if err := unix.Stat(path, &s); err != nil {
		return err
	}
	st.block = s.Mode&unix.S_IFMT == unix.S_IFBLK
	st.char = s.Mode&unix.S_IFMT == unix.S_IFCHR
	st.devno = fmt.Sprintf("%d:%d", unix.Major(s.Rdev), unix.Minor(s.Rdev))
	return nil
}

// open opens the block device exclusively (O_EXCL: the kernel refuses
// while a partition is mounted or a volume is built on it).
func (kernel) open(d disk) (device, error) {
	f, err := os.OpenFile(d.path, os.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil, refuse("/dev/%s is in use (the kernel refused an exclusive open: a partition is mounted or a RAID or device-mapper volume holds it)", d.name)
		}
		return nil, fmt.Errorf("open: %w", err)
	}
	dev, err := openFile(f)
	if err != nil {
		return nil, err
	}
	if d.ctrl != "" {
		// Admin commands go to the controller: through the namespace the
		// kernel refuses any whose nsid is not the namespace's.
		if dev.ctrl, err = os.OpenFile(d.ctrl, os.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			dev.Close()
			return nil, fmt.Errorf("open the NVMe controller: %w", err)
		}
	}
	return dev, nil
}

// openFile wraps f, a block device or a regular file.
func openFile(f *os.File) (*fileDevice, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat: %w", err)
	}
	return &fileDevice{File: f, block: st.Mode&unix.S_IFMT == unix.S_IFBLK}, nil
}

// fileDevice is a block device, or a regular file standing in for one.
type fileDevice struct {
	*os.File
	block bool
	ctrl  *os.File // an NVMe namespace's controller, nil for others
}

func (f *fileDevice) Close() error {
	if f.ctrl != nil {
		f.ctrl.Close()
	}
	return f.File.Close()
}

func (f *fileDevice) discard(off, n int64) error {
	if !f.block {
		return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	}
	return f.ioctlRange(unix.BLKDISCARD, off, n)
}

func (f *fileDevice) zeroout(off, n int64) error {
	if !f.block {
		return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	}
	return f.ioctlRange(unix.BLKZEROOUT, off, n)
}

func (f *fileDevice) ioctlRange(req uint, off, n int64) error {
	r := [2]uint64{uint64(off), uint64(n)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(unsafe.Pointer(&r))); errno != 0 {
		return errno
	}
	return nil
}

func (f *fileDevice) flush() error {
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	if f.block {
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKFLSBUF, 0); errno != 0 {
			return fmt.Errorf("BLKFLSBUF: %w", errno)
		}
	}
	return nil
}

func (f *fileDevice) reread() error {
	if !f.block {
		return nil
	}
	for i := 0; ; i++ {
		err := unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
		if err == nil || !errors.Is(err, unix.EBUSY) || i == 10 {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// nvmeIoctlID and nvmeIoctlAdminCmd are linux/nvme_ioctl.h's
// NVME_IOCTL_ID (_IO('N', 0x40)) and NVME_IOCTL_ADMIN_CMD (_IOWR('N',
// 0x41, struct nvme_passthru_cmd)).
const (
	nvmeIoctlID       = 0x4e40
	nvmeIoctlAdminCmd = 0xc0484e41
)

func (f *fileDevice) nvmeNSID() (uint32, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlID, 0)
	if errno != 0 {
		return 0, fmt.Errorf("NVME_IOCTL_ID: %w", errno)
	}
	return uint32(r), nil
}

func (f *fileDevice) nvmeAdmin(cmd *nvmeCommand, data []byte) (uint32, error) {
	if len(data) > 0 {
		cmd.addr = uint64(uintptr(unsafe.Pointer(&data[0])))
		cmd.dataLen = uint32(len(data))
	}
	// The ioctl returns the NVMe status field (positive) or fails with
	// an errno.
	fd := f.Fd()
	if f.ctrl != nil {
		fd = f.ctrl.Fd()
	}
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(cmd)))
	runtime.KeepAlive(data)
	if errno != 0 {
		return 0, fmt.Errorf("NVME_IOCTL_ADMIN_CMD: %w", errno)
	}
	return uint32(r), nil
}

// hdioGetIdentity is linux/hdreg.h's HDIO_GET_IDENTITY (libata answers it
// for ATA disks behind its SCSI translation).
const hdioGetIdentity = 0x030d

func (f *fileDevice) ataIdentify() ([]byte, error) {
	id := make([]byte, 512)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), hdioGetIdentity, uintptr(unsafe.Pointer(&id[0]))); errno == 0 {
		return id, nil
	}
	// Through SG_IO: IDENTIFY DEVICE (0xEC), PIO data-in, one block.
	cdb := ataCDB(ataProtoPIOIn, 1, 0xec)
	if err := f.sgio(cdb, id, false, 10*time.Second); err != nil {
		return nil, fmt.Errorf("IDENTIFY DEVICE: %w", err)
	}
	return id, nil
}

func (f *fileDevice) ataPassThrough(cdb, data []byte, timeout time.Duration) error {
	return f.sgio(cdb, data, true, timeout)
}

// sgIOHdr is scsi/sg.h's struct sg_io_hdr on a 64-bit kernel.
type sgIOHdr struct {
	interfaceID    int32
	dxferDirection int32
	cmdLen         uint8
	mxSbLen        uint8
	iovecCount     uint16
	dxferLen       uint32
	dxferp         uintptr
	cmdp           uintptr
	sbp            uintptr
	timeout        uint32
	flags          uint32
	packID         int32
	usrPtr         uintptr
	status         uint8
	maskedStatus   uint8
	msgStatus      uint8
	sbLenWr        uint8
	hostStatus     uint16
	driverStatus   uint16
	resid          int32
	duration       uint32
	info           uint32
}

const (
	sgIO          = 0x2285
	sgDxferNone   = -1
	sgDxferToDev  = -2
	sgDxferFromDv = -3
)

func (f *fileDevice) sgio(cdb, data []byte, out bool, timeout time.Duration) error {
	sense := make([]byte, 64)
	h := sgIOHdr{
		interfaceID:    'S',
		dxferDirection: sgDxferNone,
		cmdLen:         uint8(len(cdb)),
		mxSbLen:        uint8(len(sense)),
		cmdp:           uintptr(unsafe.Pointer(&cdb[0])),
		sbp:            uintptr(unsafe.Pointer(&sense[0])),
		timeout:        uint32(timeout.Milliseconds()),
	}
	if len(data) > 0 {
		h.dxferDirection = sgDxferFromDv
		if out {
			h.dxferDirection = sgDxferToDev
		}
		h.dxferLen = uint32(len(data))
		h.dxferp = uintptr(unsafe.Pointer(&data[0]))
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), sgIO, uintptr(unsafe.Pointer(&h)))
	runtime.KeepAlive(cdb)
	runtime.KeepAlive(data)
	runtime.KeepAlive(sense)
	if errno != 0 {
		return fmt.Errorf("SG_IO: %w", errno)
	}
	if h.status != 0 || h.hostStatus != 0 || h.driverStatus&^0x08 != 0 || (h.driverStatus&0x08 != 0 && h.sbLenWr > 0 && senseError(sense[:h.sbLenWr])) {
		return fmt.Errorf("SCSI status %#x, host status %#x, driver status %#x, sense % x", h.status, h.hostStatus, h.driverStatus, sense[:h.sbLenWr])
	}
	return nil
}

// senseError reports whether sense data says the command failed: a sense
// key other than NO SENSE or RECOVERED ERROR (descriptor or fixed format).
func senseError(sense []byte) bool {
	if len(sense) < 3 {
		return false
	}
	var key byte
	switch sense[0] & 0x7f {
	case 0x72, 0x73:
		key = sense[1] & 0x0f
	default:
		key = sense[2] & 0x0f
	}
	return key != 0 && key != 1
}
