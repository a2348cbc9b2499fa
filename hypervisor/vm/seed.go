package vm

import (
	"bytes"
	"fmt"

	"path/filepath"

	"github.com/corralhq/corral/hypervisor/cloudinit"
)

func writeSeed(path string, s *cloudinit.Seed) error {
	var buf bytes.Buffer
	if err := s.WriteISO(&buf); err != nil {
		return err
	}
	if err := writeFileAtomic(path, buf.Bytes()); err != nil {
		return fmt.Errorf("write seed %s: %w", filepath.Base(path), err)
	}
	return nil
}
