package erase

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// secure erases the disk with its own command (NVMe format or sanitize,
// ATA SECURITY ERASE UNIT), then reads back as full does. Where samples
// do not read zero after the device's erase (an NVMe drive may return
// other than zeros for deallocated blocks), the disk is zeroed as full
// does, so a secure erase leaves what a full one leaves.
func (w *work) secure(ctx context.Context) (string, error) {
	var how string
	var err error
	switch w.d.kind {
	case kindNVMe:
		how, err = w.nvmeErase(ctx)
	case kindATA:
		how, err = w.ataErase()
	default:
		return "", noSecureErase(w.d)
	}
	if err != nil {
		return "", err
	}
	if err := w.dev.reread(); err != nil && !errors.Is(err, unix.EINVAL) {
		w.log.Warn("re-read partition table after the erase", "err", err)
	}
	if err := w.dev.flush(); err != nil {
		return "", err
	}
	n, err := w.verify()
	if err == nil {
		return fmt.Sprintf("%s; %d samples read back zero", how, n), nil
	}
	if !errors.Is(err, ErrNotZero) {
		return "", err
	}
	w.log.Warn("the device's erase left non-zero blocks; zeroing", "how", how, "err", err)
	fmt.Fprintf(w.cfg.Console, "corral: %s: %s done, but blocks do not read zero (%v); zeroing\n", w.d.show(), how, err)
	full, err := w.full(ctx, false)
	if err != nil {
		return "", fmt.Errorf("after %s: %w", how, err)
	}
	return how + ", then " + full, nil
}

// nvmeCommand is linux/nvme_ioctl.h's struct nvme_passthru_cmd (72
// bytes).
type nvmeCommand struct {
	opcode      uint8
	flags       uint8
	rsvd1       uint16
	nsid        uint32
	cdw2        uint32
	cdw3        uint32
	metadata    uint64
	addr        uint64
	metadataLen uint32
	dataLen     uint32
	cdw10       uint32
	cdw11       uint32
	cdw12       uint32
	cdw13       uint32
	cdw14       uint32
	cdw15       uint32
	timeoutMS   uint32
	result      uint32
}

// NVMe admin opcodes and the fields this package reads (NVM Express Base
// Specification 2.0: Identify Controller OACS bytes 257:256, SANICAP
// 331:328, FNA 524; Identify Namespace FLBAS 26, DPS 29; Sanitize Status
// log page 81h: SPROG 1:0, SSTAT 3:2).
const (
	nvmeGetLogPage = 0x02
	nvmeIdentify   = 0x06
	nvmeFormatNVM  = 0x80
	nvmeSanitize   = 0x84

	nvmeOACSFormat   = 1 << 1
	nvmeFNASecureAll = 1 << 1

	nvmeSanitizeCrypto = 1 << 0
	nvmeSanitizeBlock  = 1 << 1
	nvmeSanitizeOver   = 1 << 2

	// nvmeFormatTimeout bounds a Format NVM: a secure erase of a large
	// drive takes minutes (the kernel's default admin timeout is 60 s).
	nvmeFormatTimeout = 2 * time.Hour
	nvmeSanitizeMax   = 24 * time.Hour
)

// sanitizePoll is how often the Sanitize Status log page is read (tests
// shorten it).
var sanitizePoll = time.Second

// formatCDW10 is Format NVM's command dword 10 that keeps the namespace's
// LBA format (FLBAS: index bits 3:0 and 6:5, metadata setting bit 4) and
// protection (DPS: type bits 2:0, location bit 3) and asks for Secure
// Erase Settings 001b, user data erase (bits 11:9).
func formatCDW10(flbas, dps byte) uint32 {
	lbaf := uint32(flbas&0x0f) | uint32(flbas>>5&0x03)<<4
	c := lbaf & 0x0f             // LBAFL
	c |= uint32(flbas>>4&1) << 4 // MSET
	c |= uint32(dps&0x07) << 5   // PI
	c |= uint32(dps>>3&1) << 8   // PIL
	c |= 1 << 9                  // SES = 1: user data erase
	c |= (lbaf >> 4) << 12       // LBAFU
	return c
}

// nvmeErase checks Identify Controller and sends Format NVM with user
// data erase to the namespace, or, when the controller lacks Format NVM
// and has sanitize, a sanitize (block erase, crypto erase or overwrite,
// the first it supports) and waits for it.
func (w *work) nvmeErase(ctx context.Context) (string, error) {
	nsid, err := w.dev.nvmeNSID()
	if err != nil {
		return "", fmt.Errorf("NVMe namespace ID: %w", err)
	}
	if w.d.ctrl == "" {
		return "", refuse("%s: no NVMe controller device found for the namespace (/sys/block/%s/device, /dev/nvmeX)", w.d.show(), w.d.name)
	}
	w.log.Info("nvme admin commands go to the controller", "controller", w.d.ctrl, "nsid", nsid)
	ctrl := make([]byte, 4096)
	if err := w.admin("Identify Controller", &nvmeCommand{opcode: nvmeIdentify, cdw10: 1}, ctrl, false); err != nil {
		return "", err
	}
	oacs := binary.LittleEndian.Uint16(ctrl[256:])
	sanicap := binary.LittleEndian.Uint32(ctrl[328:])
	fna := ctrl[524]
	model := strings.TrimSpace(string(ctrl[24:64]))
	w.log.Info("nvme controller", "model", model, "nsid", nsid, "oacs", fmt.Sprintf("%#04x", oacs), "fna", fmt.Sprintf("%#02x", fna), "sanicap", fmt.Sprintf("%#08x", sanicap))
	fmt.Fprintf(w.cfg.Console, "corral: %s: NVMe controller %q, namespace %d: OACS %#04x (Format NVM %v), FNA %#02x, SANICAP %#08x\n",
		w.d.show(), model, nsid, oacs, oacs&nvmeOACSFormat != 0, fna, sanicap)

	if oacs&nvmeOACSFormat != 0 {
		ns := make([]byte, 4096)
		if err := w.admin("Identify Namespace", &nvmeCommand{opcode: nvmeIdentify, nsid: nsid, cdw10: 0}, ns, false); err != nil {
			return "", err
		}
		cdw10 := formatCDW10(ns[26], ns[29])
		if fna&nvmeFNASecureAll != 0 {
			w.log.Info("the controller's secure erase applies to every namespace it has (FNA bit 1)")
		}
		w.report("NVMe Format NVM, user data erase")
		cmd := &nvmeCommand{opcode: nvmeFormatNVM, nsid: nsid, cdw10: cdw10, timeoutMS: uint32(nvmeFormatTimeout.Milliseconds())}
		if err := w.waiting("NVMe Format NVM, user data erase", func() error { return w.admin("Format NVM", cmd, nil, false) }); err != nil {
			return "", err
		}
		return "NVMe Format NVM with user data erase", nil
	}
	if sanicap&(nvmeSanitizeCrypto|nvmeSanitizeBlock|nvmeSanitizeOver) != 0 {
		return w.nvmeSanitize(ctx, sanicap)
	}
	return "", refuse("%s: the NVMe controller supports neither Format NVM nor sanitize", w.d.show())
}

// nvmeSanitize starts a sanitize and polls the Sanitize Status log page
// until it completes, fails or ctx ends.
func (w *work) nvmeSanitize(ctx context.Context, sanicap uint32) (string, error) {
	var act uint32
	var name string
	switch {
	case sanicap&nvmeSanitizeBlock != 0:
		act, name = 2, "block erase"
	case sanicap&nvmeSanitizeCrypto != 0:
		act, name = 4, "crypto erase"
	default:
		act, name = 3|1<<4, "overwrite" // one pass (OWPASS bits 7:4), pattern 0 (cdw11)
	}
	w.report("NVMe sanitize, " + name)
	if err := w.admin("Sanitize", &nvmeCommand{opcode: nvmeSanitize, cdw10: act}, nil, false); err != nil {
		return "", err
	}
	deadline := time.Now().Add(nvmeSanitizeMax)
	logPage := make([]byte, 512)
	for {
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for the sanitize (it goes on in the drive): %w", ctx.Err())
		case <-time.After(sanitizePoll):
		}
		clear(logPage)
		numd := uint32(len(logPage)/4 - 1)
		cmd := &nvmeCommand{opcode: nvmeGetLogPage, nsid: 0xffffffff, cdw10: 0x81 | (numd&0xffff)<<16, cdw11: numd >> 16}
		if err := w.admin("Get Log Page (Sanitize Status)", cmd, logPage, true); err != nil {
			return "", err
		}
		sprog := binary.LittleEndian.Uint16(logPage[0:])
		sstat := binary.LittleEndian.Uint16(logPage[2:]) & 0x7
		switch sstat {
		case 1, 4: // completed (4: without deallocation)
			w.log.Info("nvme sanitize completed", "sstat", sstat)
			return "NVMe sanitize (" + name + ")", nil
		case 3:
			return "", fmt.Errorf("NVMe sanitize (%s) failed (Sanitize Status SSTAT 3)", name)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("NVMe sanitize (%s) not done after %v", name, nvmeSanitizeMax)
		}
		w.tick(fmt.Sprintf("NVMe sanitize, %s, %d%%", name, int(sprog)*100/65536))
	}
}

// waiting runs fn, a device command that blocks for as long as the
// device takes, and meanwhile reports "<what>, <time> so far" at most
// every ProgressEvery, so the appliance sees the erase alive. It returns
// once fn has and the reporting has stopped.
func (w *work) waiting(what string, fn func() error) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		start := time.Now()
		t := time.NewTicker(w.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				w.tick(fmt.Sprintf("%s, %s so far", what, time.Since(start).Round(time.Second)))
			}
		}
	})
	err := fn()
	close(done)
	wg.Wait()
	return err
}

// admin sends an NVMe admin command and logs, unless quiet, exactly what
// was sent and what the controller answered.
func (w *work) admin(name string, cmd *nvmeCommand, data []byte, quiet bool) error {
	if len(data) > 0 {
		cmd.dataLen = uint32(len(data))
	}
	sent := fmt.Sprintf("opcode %#02x, nsid %#x, cdw10 %#08x, cdw11 %#08x, data %d bytes, timeout %d ms",
		cmd.opcode, cmd.nsid, cmd.cdw10, cmd.cdw11, cmd.dataLen, cmd.timeoutMS)
	level := w.log.Info
	if quiet {
		level = w.log.Debug
	}
	level("nvme admin command sent", "command", name, "opcode", fmt.Sprintf("%#02x", cmd.opcode), "nsid", cmd.nsid,
		"cdw10", fmt.Sprintf("%#08x", cmd.cdw10), "cdw11", fmt.Sprintf("%#08x", cmd.cdw11), "data_len", cmd.dataLen, "timeout_ms", cmd.timeoutMS)
	start := time.Now()
	status, err := w.dev.nvmeAdmin(cmd, data)
	answer := fmt.Sprintf("status %#x (%s), result %#x", status, nvmeStatus(status), cmd.result)
	if err != nil {
		answer = err.Error()
	}
	level("nvme admin command answered", "command", name, "status", fmt.Sprintf("%#x", status), "status_text", nvmeStatus(status),
		"result", fmt.Sprintf("%#x", cmd.result), "err", err, "seconds", time.Since(start).Seconds())
	if !quiet {
		fmt.Fprintf(w.cfg.Console, "corral: %s: NVMe %s (%s): %s\n", w.d.show(), name, sent, answer)
	}
	if err != nil {
		return fmt.Errorf("NVMe %s (%s): %w", name, sent, err)
	}
	if status != 0 {
		return fmt.Errorf("NVMe %s (%s): the controller answered status %#x (%s)", name, sent, status, nvmeStatus(status))
	}
	return nil
}

// nvmeStatus names a status field the kernel returns (the completion's
// status without its phase bit: SC bits 7:0, SCT bits 10:8, DNR bit 14).
func nvmeStatus(s uint32) string {
	if s == 0 {
		return "success"
	}
	sct, sc := s>>8&0x7, s&0xff
	names := map[[2]uint32]string{
		{0, 0x01}: "invalid command opcode",
		{0, 0x02}: "invalid field in command",
		{0, 0x0b}: "invalid namespace or format",
		{0, 0x1c}: "sanitize failed",
		{0, 0x1d}: "sanitize in progress",
		{0, 0x80}: "LBA out of range",
		{1, 0x0a}: "invalid format",
		{1, 0x0b}: "firmware activation requires conventional reset",
		{1, 0x1d}: "sanitize prohibited while persistent memory region is enabled",
	}
	if n, ok := names[[2]uint32{sct, sc}]; ok {
		return fmt.Sprintf("type %d code %#02x: %s", sct, sc, n)
	}
	return fmt.Sprintf("type %d code %#02x", sct, sc)
}

// ATA PASS-THROUGH (16) protocols (SAT-3).
const (
	ataProtoNonData = 3
	ataProtoPIOIn   = 4
	ataProtoPIOOut  = 5
)

// ATA security commands (ACS-3 7.40-7.45) and IDENTIFY DEVICE words.
const (
	ataSecuritySetPassword  = 0xf1
	ataSecurityErasePrepare = 0xf3
	ataSecurityEraseUnit    = 0xf4

	ataSecSupported = 1 << 0 // word 128
	ataSecEnabled   = 1 << 1
	ataSecLocked    = 1 << 2
	ataSecFrozen    = 1 << 3
	ataSecExpired   = 1 << 4
	ataSecEnhanced  = 1 << 5
)

// ataPassword is the user password SECURITY SET PASSWORD sets before the
// erase (the drive clears it when the erase succeeds). It is fixed and
// logged, not random: a drive left locked by an interrupted erase can be
// unlocked with it (hdparm --user-master u --security-disable corral-erase).
const ataPassword = "corral-erase"

// ataCDB builds an ATA PASS-THROUGH (16) CDB for a 28-bit command with
// one block of data or none.
func ataCDB(proto, count, command byte) []byte {
	c := make([]byte, 16)
	c[0] = 0x85
	c[1] = proto << 1
	switch proto {
	case ataProtoPIOIn:
		c[2] = 0x0e // T_DIR from the device, BYT_BLOK, T_LENGTH in the sector count
	case ataProtoPIOOut:
		c[2] = 0x06 // T_DIR to the device, BYT_BLOK, T_LENGTH in the sector count
	}
	c[6] = count // the features register (c[4]) stays 0 for these commands
	c[14] = command
	return c
}

// ataErase reads IDENTIFY DEVICE and, only where the security feature
// set is supported and neither enabled, locked, frozen nor expired, sets
// the user password and sends SECURITY ERASE PREPARE and SECURITY ERASE
// UNIT (enhanced where the drive supports it).
func (w *work) ataErase() (string, error) {
	id, err := w.dev.ataIdentify()
	if err != nil {
		return "", refuse("%s: cannot read the ATA IDENTIFY data: %v", w.d.show(), err)
	}
	word := func(i int) uint16 { return binary.LittleEndian.Uint16(id[2*i:]) }
	sec := word(128)
	w.log.Info("ata identify", "model", ataString(id[54:94]), "word82", fmt.Sprintf("%#04x", word(82)), "security", fmt.Sprintf("%#04x", sec),
		"erase_time", fmt.Sprintf("%#04x", word(89)), "enhanced_erase_time", fmt.Sprintf("%#04x", word(90)))
	switch {
	case word(82)&(1<<1) == 0 || sec&ataSecSupported == 0:
		return "", refuse("%s: the ATA security feature set is not supported", w.d.show())
	case sec&ataSecFrozen != 0:
		return "", refuse("%s: the ATA security feature set is frozen", w.d.show())
	case sec&ataSecLocked != 0:
		return "", refuse("%s: the disk is locked by an ATA security password", w.d.show())
	case sec&ataSecEnabled != 0:
		return "", refuse("%s: an ATA security password is already set", w.d.show())
	case sec&ataSecExpired != 0:
		return "", refuse("%s: the ATA security password attempt count has expired", w.d.show())
	}
	enhanced := sec&ataSecEnhanced != 0
	timeout := ataEraseTimeout(word(89))
	kind := "normal"
	if enhanced {
		timeout, kind = ataEraseTimeout(word(90)), "enhanced"
	}

	pw := make([]byte, 512) // word 0: user password, high security
	copy(pw[2:34], ataPassword)
	if err := w.ata("SECURITY SET PASSWORD", ataCDB(ataProtoPIOOut, 1, ataSecuritySetPassword), pw, 30*time.Second); err != nil {
		return "", err
	}
	if err := w.ata("SECURITY ERASE PREPARE", ataCDB(ataProtoNonData, 0, ataSecurityErasePrepare), nil, 30*time.Second); err != nil {
		return "", err
	}
	unit := make([]byte, 512) // word 0 bit 0: user password; bit 1: enhanced
	if enhanced {
		unit[0] = 0x02
	}
	copy(unit[2:34], ataPassword)
	w.report(fmt.Sprintf("ATA SECURITY ERASE UNIT (%s; the drive allows up to %v)", kind, timeout.Round(time.Minute)))
	err = w.waiting("ATA SECURITY ERASE UNIT ("+kind+")", func() error {
		return w.ata("SECURITY ERASE UNIT", ataCDB(ataProtoPIOOut, 1, ataSecurityEraseUnit), unit, timeout)
	})
	if err != nil {
		return "", err
	}
	return "ATA SECURITY ERASE UNIT (" + kind + ")", nil
}

// ata sends one ATA command and logs what was sent and the answer.
func (w *work) ata(name string, cdb, data []byte, timeout time.Duration) error {
	w.log.Info("ata command sent", "command", name, "cdb", fmt.Sprintf("% x", cdb), "data_len", len(data), "timeout", timeout.String())
	err := w.dev.ataPassThrough(cdb, data, timeout)
	w.log.Info("ata command answered", "command", name, "err", err)
	answer := "done"
	if err != nil {
		answer = err.Error()
	}
	fmt.Fprintf(w.cfg.Console, "corral: %s: ATA %s (CDB % x): %s\n", w.d.show(), name, cdb, answer)
	if err != nil {
		return fmt.Errorf("ATA %s: %w", name, err)
	}
	return nil
}

// ataEraseTimeout reads IDENTIFY word 89 or 90 (the erase time in
// 2-minute units: bits 14:0 when bit 15 is set, else bits 7:0 with 255
// meaning more than 508 minutes) and adds half an hour; 12 hours when the
// drive does not say.
func ataEraseTimeout(w uint16) time.Duration {
	units := w & 0xff
	if w&0x8000 != 0 {
		units = w & 0x7fff
	} else if units == 255 {
		units = 0
	}
	if units == 0 {
		return 12 * time.Hour
	}
	return time.Duration(units)*2*time.Minute + 30*time.Minute
}

// ataString decodes an IDENTIFY string (bytes swapped in each word).
func ataString(b []byte) string {
	s := make([]byte, len(b))
	for i := 0; i+1 < len(b); i += 2 {
		s[i], s[i+1] = b[i+1], b[i]
	}
	return strings.TrimSpace(string(s))
}
