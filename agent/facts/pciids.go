package facts

import (
	"bytes"
	"os"
)

// pciNames are the names pci.ids gives the IDs a machine has: vendors by
// "vvvv", products by "vvvvpppp", subclasses by "ccss".
type pciNames struct {
	vendors, products, subclasses map[string]string
}

// readPCINames reads pci.ids at path in one pass and keeps only the names
// of the wanted IDs (same keys as pciNames). The whole database, parsed
// into maps (jaypipes/pcidb), cost seconds of a discovery boot under
// emulation for the few devices a machine has. Returns nil when the file
// cannot be read.
func readPCINames(path string, vendors, products, subclasses map[string]bool) *pciNames {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	n := &pciNames{vendors: map[string]string{}, products: map[string]string{}, subclasses: map[string]string{}}
	// The section a tab-indented line belongs to: a vendor with wanted
	// products ("" for the others, whose lines are skipped) or a class.
	var vendor, class string
	wantedVendor := map[string]bool{}
	for vp := range products {
		if len(vp) >= 4 {
			wantedVendor[vp[:4]] = true
		}
	}
	inClasses := false
	for len(b) > 0 {
		var line []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			line, b = b, nil
		}
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		switch {
		case line[0] != '\t':
			vendor, class = "", ""
			if len(line) > 2 && line[0] == 'C' && line[1] == ' ' {
				// "C cc  Class name": the class section.
				inClasses = true
				if id, _, ok := idName(line[2:]); ok {
					class = string(id)
				}
				continue
			}
			inClasses = false
			if id, name, ok := idName(line); ok {
				vendor = ""
				if vendors[string(id)] || wantedVendor[string(id)] {
					vendor = string(id)
				}
				if vendors[vendor] {
					n.vendors[vendor] = string(name)
				}
			}
		case len(line) > 1 && line[1] == '\t':
			// Subsystems and programming interfaces: not used.
		case inClasses && class != "":
			if id, name, ok := idName(line[1:]); ok && subclasses[class+string(id)] {
				n.subclasses[class+string(id)] = string(name)
			}
		case vendor != "":
			if id, name, ok := idName(line[1:]); ok && products[vendor+string(id)] {
				n.products[vendor+string(id)] = string(name)
			}
		}
	}
	return n
}

// idName splits "id  name" (pci.ids writes IDs in lower case, as sysfs
// reads are normalised).
func idName(line []byte) (id, name []byte, ok bool) {
	i := bytes.IndexByte(line, ' ')
	if i <= 0 {
		return nil, nil, false
	}
	return line[:i], bytes.TrimSpace(line[i:]), true
}
