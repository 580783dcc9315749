package hooks

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Tables are the one other thing besides its memory that a plugin can grow
// at run time (table.grow), and wazero lets a table without a declared
// maximum grow to 2^32 elements of 8 bytes of host memory each, outside the
// memory limit. boundTables therefore rewrites the module's table section
// before it is compiled: a table without a maximum gets its initial size as
// its maximum (Go and Rust guests never grow their tables), and a module
// whose tables could hold more than limit/256 elements in all (a 32nd of
// the memory limit in host memory) is refused.

// The parts of the WebAssembly binary format boundTables reads.
const (
	wasmHeaderSize   = 8    // magic and version
	sectionTable     = 4    // the table section's id
	limitsMin        = 0x00 // limits flag: minimum only
	limitsMinMax     = 0x01 // limits flag: minimum and maximum
	refFunc          = 0x70 // funcref
	refExtern        = 0x6f // externref
	tableElementCost = 8    // host bytes per table element (a wazero Reference)
)

// boundTables returns the module with every table bounded as described
// above, or an error saying why it is refused. A module has at most one
// table section (wazero refuses sections out of order); a module it cannot
// read is returned unchanged, for the compiler to reject with its own error.
func boundTables(module []byte, limit uint64) ([]byte, error) {
	if len(module) < wasmHeaderSize {
		return module, nil
	}
	for at := wasmHeaderSize; at < len(module); {
		size, n := binary.Uvarint(module[at+1:])
		body := at + 1 + n
		if n <= 0 || size > uint64(len(module)-body) {
			return module, nil
		}
		end := body + int(size)
		if module[at] != sectionTable {
			at = end
			continue
		}
		tables, err := boundTableSection(module[body:end], limit)
		if err != nil {
			return nil, fmt.Errorf("tables: %w", err)
		}
		out := binary.AppendUvarint(append(module[:at:at], sectionTable), uint64(len(tables)))
		out = append(out, tables...)
		return append(out, module[end:]...), nil
	}
	return module, nil
}

// boundTableSection returns a table section whose tables all declare a
// maximum, or an error when they could hold too many elements.
func boundTableSection(section []byte, limit uint64) ([]byte, error) {
	r := bytes.NewReader(section)
	count, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, errors.New("unreadable table section")
	}
	out := binary.AppendUvarint(nil, count)
	var total uint64
	for i := range count {
		refType, minimum, maximum, err := readTable(r)
		if err != nil {
			return nil, fmt.Errorf("table %d: %w", i, err)
		}
		total += maximum
		out = append(out, refType, limitsMinMax)
		out = binary.AppendUvarint(binary.AppendUvarint(out, minimum), maximum)
	}
	if r.Len() != 0 {
		return nil, errors.New("unreadable table section")
	}
	if allowed := limit / (32 * tableElementCost); total > allowed {
		return nil, fmt.Errorf("they may hold %d elements, more than the %d (8 bytes of host memory each) that a memoryLimit of %d MiB allows",
			total, allowed, limit>>20)
	}
	return out, nil
}

// readTable reads one table type; a table without a maximum gets its
// minimum as maximum.
func readTable(r *bytes.Reader) (refType byte, minimum, maximum uint64, err error) {
	refType, err1 := r.ReadByte()
	flag, err2 := r.ReadByte()
	if err1 != nil || err2 != nil {
		return 0, 0, 0, errors.New("cut short")
	}
	if refType != refFunc && refType != refExtern {
		return 0, 0, 0, fmt.Errorf("element type %#x is not one Weir accepts (funcref or externref)", refType)
	}
	if flag != limitsMin && flag != limitsMinMax {
		return 0, 0, 0, fmt.Errorf("limits of kind %#x are not ones Weir accepts", flag)
	}
	minimum, err = binary.ReadUvarint(r)
	maximum = minimum
	if err == nil && flag == limitsMinMax {
		maximum, err = binary.ReadUvarint(r)
	}
	if err != nil || maximum > math.MaxUint32 {
		return 0, 0, 0, errors.New("malformed limits")
	}
	return refType, minimum, maximum, nil
}
