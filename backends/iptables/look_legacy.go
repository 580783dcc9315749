package iptables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The x_tables blob of an iptables-legacy table, read as the tools read it
// (getsockopt IPT_SO_GET_INFO, then IPT_SO_GET_ENTRIES) and walked entry by
// entry. Layout, from linux/netfilter_ipv4/ip_tables.h and ip6_tables.h:
// an entry is the family's fixed header (ipt_entry 112 bytes, ip6t_entry
// 168), its matches, then its target at target_offset; the next entry is
// next_offset further. Each match and target starts with a 32-byte header
// (u16 size, name[29], revision). A user chain starts with an ERROR target
// naming it and ends with an unconditional RETURN; a built-in chain runs
// from its hook entry to its underflow (the policy); the table ends with
// an ERROR target named "ERROR". A standard target (empty name) carries an
// int32 verdict: negative for ACCEPT, DROP, RETURN..., else the offset of
// the entry to jump to.

// The getsockopt numbers (IPT_BASE_CTL and IP6T_BASE_CTL are both 64).
const (
	soGetInfo    = 64
	soGetEntries = 65
)

// blobLayout is where the fields of one family's entries are.
type blobLayout struct {
	entrySize     int // sizeof(ipt_entry)
	targetOffset  int // of the u16 target_offset
	socketFamily  int
	socketLevel   int
	getInfoLength int // sizeof(ipt_getinfo)
}

var (
	blob4 = blobLayout{entrySize: 112, targetOffset: 88, socketFamily: unix.AF_INET, socketLevel: unix.SOL_IP, getInfoLength: 84}
	blob6 = blobLayout{entrySize: 168, targetOffset: 140, socketFamily: unix.AF_INET6, socketLevel: unix.SOL_IPV6, getInfoLength: 84}
)

// builtinChains are the built-in chains by netfilter hook number.
var builtinChains = [5]string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

// tableInfo is the part of ipt_getinfo a walk needs.
type tableInfo struct {
	validHooks    uint32
	hookEntry     [5]uint32
	underflow     [5]uint32
	entries, size uint32
}

// lookLegacy reads table of family f from the kernel's x_tables inside
// netNS. A table the kernel does not have yet looks empty.
func lookLegacy(netNS int, f ipFamily, table string) (*tableLook, error) {
	layout := blob4
	if f == ipv6 {
		layout = blob6
	}
	var l *tableLook
	err := inNetNS(netNS, func() error {
		fd, err := unix.Socket(layout.socketFamily, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		// The table may change between the two calls: the second then
		// fails with EAGAIN; try again.
		for range 5 {
			info, err := getInfo(fd, layout, table)
			if errors.Is(err, unix.ENOENT) {
				l = newTableLook(false)
				return nil
			}
			if err != nil {
				return err
			}
			l, err = getEntries(fd, layout, table, info)
			if !errors.Is(err, unix.EAGAIN) {
				return err
			}
		}
		return fmt.Errorf("table %s kept changing while read", table)
	})
	return l, err
}

// getsockopt calls getsockopt(fd, level, opt) with buf and returns the
// length the kernel wrote.
func getsockopt(fd, level, opt int, buf []byte) error {
	n := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// getInfo reads the table's hooks and size.
func getInfo(fd int, layout blobLayout, table string) (tableInfo, error) {
	buf := make([]byte, layout.getInfoLength)
	copy(buf, table)
	if err := getsockopt(fd, layout.socketLevel, soGetInfo, buf); err != nil {
		return tableInfo{}, fmt.Errorf("getsockopt GET_INFO %s: %w", table, err)
	}
	le := binary.NativeEndian
	var info tableInfo
	info.validHooks = le.Uint32(buf[32:])
	for h := range 5 {
		info.hookEntry[h] = le.Uint32(buf[36+4*h:])
		info.underflow[h] = le.Uint32(buf[56+4*h:])
	}
	info.entries, info.size = le.Uint32(buf[76:]), le.Uint32(buf[80:])
	return info, nil
}

// entriesHeader is sizeof(ipt_get_entries): name[32], size, padding to the
// 8-byte alignment of the entries.
const entriesHeader = 40

// getEntries reads the table's entries into memory mapped for the call
// (100 MB at 10k services: kept out of the Go heap) and walks them.
func getEntries(fd int, layout blobLayout, table string, info tableInfo) (*tableLook, error) {
	buf, err := unix.Mmap(-1, 0, entriesHeader+int(info.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes for table %s: %w", info.size, table, err)
	}
	defer func() { _ = unix.Munmap(buf) }() // cannot fail for a mapping Mmap made
	copy(buf, table)
	binary.NativeEndian.PutUint32(buf[32:], info.size)
	if err := getsockopt(fd, layout.socketLevel, soGetEntries, buf); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return nil, err
		}
		return nil, fmt.Errorf("getsockopt GET_ENTRIES %s: %w", table, err)
	}
	return walkBlob(buf[entriesHeader:], layout, info, table)
}

// blobEntry is one entry of a blob, as the walk needs it.
type blobEntry struct {
	chain   string // of a built-in chain's rule
	verdict int32  // of a standard target
	comment string // of a comment match, in a built-in chain's rule
	ctstate bool   // has a conntrack or state match
}

// walkBlob counts the rules of every chain in a table's entries and
// collects the jumps of its built-in chains.
func walkBlob(b []byte, layout blobLayout, info tableInfo, table string) (*tableLook, error) {
	l := newTableLook(false)
	var heads []int         // offsets of user chain heads, in order
	var names []string      // their chains
	var pending []blobEntry // standard jumps of built-in chains
	chain, builtin, underflow := "", false, -1
	for off := 0; off < len(b); {
		next, err := checkEntry(b, off, layout)
		if err != nil {
			return nil, err
		}
		if h := hookAt(info, off); h >= 0 {
			chain, builtin, underflow = builtinChains[h], true, int(info.underflow[h])
			l.counts[chain] = 0
		}
		target := b[off+int(binary.NativeEndian.Uint16(b[off+layout.targetOffset:])) : next]
		switch {
		case nameIs(target[2:31], "ERROR"):
			if !builtin && chain != "" {
				l.counts[chain]-- // the chain's closing RETURN is no rule
			}
			label := cstring(target[32:])
			if label == "ERROR" {
				return finishJumps(l, table, pending, heads, names), nil
			}
			chain, builtin = label, false
			l.counts[chain] = 0
			heads, names = append(heads, off), append(names, chain)
		case builtin && off == underflow:
			chain, builtin = "", false // the policy
		case chain != "":
			l.counts[chain]++
			if builtin && target[2] == 0 && len(target) >= 36 {
				e := matches(b[off+layout.entrySize : off+int(binary.NativeEndian.Uint16(b[off+layout.targetOffset:]))])
				e.chain, e.verdict = chain, int32(binary.NativeEndian.Uint32(target[32:]))
				pending = append(pending, e)
			}
		}
		off = next
	}
	return nil, errors.New("table blob ends without its ERROR entry")
}

// hookAt returns the hook whose built-in chain starts at off, or -1.
func hookAt(info tableInfo, off int) int {
	for h := range 5 {
		if info.validHooks&(1<<h) != 0 && int(info.hookEntry[h]) == off {
			return h
		}
	}
	return -1
}

// finishJumps resolves the standard jumps of built-in rules to the chains
// they reach: the user chain whose head is at or before the offset.
func finishJumps(l *tableLook, table string, pending []blobEntry, heads []int, names []string) *tableLook {
	for _, e := range pending {
		if e.verdict < 0 || e.comment == "" {
			continue
		}
		i, found := slices.BinarySearch(heads, int(e.verdict))
		if !found {
			i--
		}
		if i >= 0 {
			l.jumps[jump{table: table, from: e.chain, to: names[i], comment: e.comment, newOnly: e.ctstate}] = true
		}
	}
	return l
}

// checkEntry checks that the entry at off fits in b, with its target, and
// returns the offset of the next.
func checkEntry(b []byte, off int, layout blobLayout) (int, error) {
	if off+layout.entrySize > len(b) {
		return 0, fmt.Errorf("table blob truncated at entry %d", off)
	}
	targetOff := int(binary.NativeEndian.Uint16(b[off+layout.targetOffset:]))
	nextOff := int(binary.NativeEndian.Uint16(b[off+layout.targetOffset+2:]))
	if targetOff < layout.entrySize || nextOff < targetOff+32 || off+nextOff > len(b) {
		return 0, fmt.Errorf("table blob: bad entry at %d", off)
	}
	return off + nextOff, nil
}

// matches reads the comment and the connection-state matches of an
// entry's matches m.
func matches(m []byte) blobEntry {
	var e blobEntry
	for len(m) >= 32 {
		size := int(binary.NativeEndian.Uint16(m))
		if size < 32 || size > len(m) {
			break
		}
		name := m[2:31]
		switch {
		case nameIs(name, "comment"):
			e.comment = cstring(m[32:size])
		case nameIs(name, "conntrack"), nameIs(name, "state"):
			e.ctstate = true
		}
		m = m[size:]
	}
	return e
}

// nameIs says whether the NUL-padded name field b holds name.
func nameIs(b []byte, name string) bool {
	return len(b) > len(name) && string(b[:len(name)]) == name && b[len(name)] == 0
}

// cstring returns b up to its first NUL.
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
