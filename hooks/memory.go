package hooks

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
	"golang.org/x/sys/unix"
)

// linearMemory backs one instance's linear memory with address space
// reserved once for the plugin's whole memory limit and made readable and
// writable as the plugin grows its memory. Growing never moves or copies
// the memory (wazero's default grows a Go slice, copying it each time and
// leaving the old copies to the garbage collector, which cost the host up
// to four times the limit), the host backs only the pages the plugin has
// touched, and closing the instance unmaps the memory at once.
//
// wazero calls Reallocate and Free on the goroutine running or closing the
// instance, one at a time, so linearMemory needs no lock.
type linearMemory struct {
	reserved []byte    // the whole reservation; nil once freed
	usable   int       // bytes at the start of reserved that are readable and writable
	count    *reserved // the plugin's count of reservations
}

// reserved counts a plugin's live reservations, and the most there were,
// for the test of the bound docs/plugin-abi.md states.
type reserved struct{ live, peak atomic.Int64 }

// reserveMemory reserves limit bytes of address space, counted in count.
// The reservation costs neither memory nor commit charge until Reallocate
// makes it usable.
func reserveMemory(limit uint64, count *reserved) (*linearMemory, error) {
	b, err := unix.Mmap(-1, 0, int(limit), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserve %d MiB of address space for the plugin's memory: %w", limit>>20, err)
	}
	live := count.live.Add(1)
	for peak := count.peak.Load(); live > peak && !count.peak.CompareAndSwap(peak, live); peak = count.peak.Load() {
	}
	return &linearMemory{reserved: b, count: count}, nil
}

// allocator returns ctx carrying a wazero allocator that hands m to the
// instance being created.
func (m *linearMemory) allocator(ctx context.Context) context.Context {
	return experimental.WithMemoryAllocator(ctx, experimental.MemoryAllocatorFunc(
		func(_, max uint64) experimental.LinearMemory {
			if max > uint64(len(m.reserved)) { // wazero caps max at the limit reserved; be safe anyway
				max = uint64(len(m.reserved))
			}
			m.reserved = m.reserved[:max]
			return m
		}))
}

// Reallocate makes the first size bytes usable and returns them, or nil
// when size is beyond the limit or the kernel refuses the memory (the
// plugin's memory.grow then fails, as at its limit).
func (m *linearMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.reserved)) {
		return nil
	}
	if n := int(size); n > m.usable {
		if err := unix.Mprotect(m.reserved[m.usable:n], unix.PROT_READ|unix.PROT_WRITE); err != nil {
			return nil
		}
		m.usable = n
	}
	return m.reserved[:size:size]
}

// Free unmaps the memory in the background (unmapping 4 GiB takes half a
// second, which a failed call need not wait for); it is idempotent.
func (m *linearMemory) Free() {
	if m.reserved == nil {
		return
	}
	b := m.reserved[:cap(m.reserved)]
	m.reserved, m.usable = nil, 0
	m.count.live.Add(-1)
	go func() { _ = unix.Munmap(b) }()
}
