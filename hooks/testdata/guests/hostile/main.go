// Command hostile is a test plugin that misbehaves in the way its config
// ({"mode": "..."}) names, to show that Weir contains it. It misbehaves only
// on batches holding a service annotated hostile.weir.dev/act: "true" and
// returns the others unchanged, so a test can show that the next call
// works. Modes "report", "where" and "tell" are well-behaved and act on
// every batch: they print each batch's size and Full flag, its address in
// memory, or its node's name and its first endpoint's node name.
package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"unsafe"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
)

// actAnnotation marks the services that trigger the misbehaviour.
const actAnnotation = "hostile.weir.dev/act"

var modes = map[string]func(b *abi.Batch) error{
	"loop":       loop,
	"membomb":    membomb,
	"panic":      func(*abi.Batch) error { panic("hostile guest panics on purpose") },
	"garbage":    garbage,
	"invent":     invent,
	"readfile":   readfile,
	"addservice": addService,
	"vip":        vip,
	"fail":       fail,
	"chatty":     chatty,
	"report":     report,
	"where":      where,
	"tell":       tell,
	"hog":        hog,
	"scribble":   scribble,
}

var (
	mode      func(b *abi.Batch) error
	reporting bool
)

func init() {
	guest.Register(guest.Plugin{Configure: configure, Process: process})
}

func main() {}

func configure(config []byte) error {
	var c struct {
		Mode string `json:"mode"`
	}
	if err := guest.DecodeConfig(config, &c); err != nil {
		return err
	}
	mode, reporting = modes[c.Mode], c.Mode == "report" || c.Mode == "where" || c.Mode == "tell"
	if mode == nil {
		return fmt.Errorf("unknown mode %q", c.Mode)
	}
	return nil
}

func process(b *abi.Batch) error {
	if acts(b) || reporting {
		return mode(b)
	}
	return nil
}

// acts reports whether the batch holds a service that triggers the mode.
func acts(b *abi.Batch) bool {
	for i := range b.Len() {
		if v, _ := b.Service(i).Annotation(actAnnotation); v == "true" {
			return true
		}
	}
	return false
}

// report prints what the batch holds.
func report(b *abi.Batch) error {
	fmt.Printf("batch services=%d full=%v\n", b.Len(), b.Full())
	return nil
}

// where prints where the batch is in memory and how long it is.
func where(b *abi.Batch) error {
	fmt.Printf("batch at=%d len=%d\n", uintptr(unsafe.Pointer(unsafe.SliceData(b.Bytes()))), len(b.Bytes()))
	return nil
}

// tell prints the node's name and the first endpoint's node name.
func tell(b *abi.Batch) error {
	first := ""
	for i := range b.Len() {
		if s := b.Service(i); s.Len() > 0 {
			first = s.Endpoint(0).NodeName()
			break
		}
	}
	fmt.Printf("node=%s first=%s\n", b.NodeName(), first)
	return nil
}

// hog keeps 2 MiB more of its memory, written, on each batch, and
// succeeds: its memory grows as a plugin's might over a big sync.
func hog(*abi.Batch) error {
	b := make([]byte, 2<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	sink = append(sink, b)
	return nil
}

// scribble rewrites what Weir does not check: the node's name and every
// endpoint's node name now point at the first service's name. It also
// doubles every weight, which Weir reads back.
func scribble(b *abi.Batch) error {
	buf := b.Bytes()
	name := record(b, 0) + 32
	copy(buf[16:24], buf[name:name+8])
	for i := range b.Len() {
		rec := record(b, i)
		eoff := rec + int(uint32(buf[rec+60])|uint32(buf[rec+61])<<8|uint32(buf[rec+62])<<16|uint32(buf[rec+63])<<24)
		for j := range b.Service(i).Len() {
			copy(buf[eoff+52*j+28:eoff+52*j+36], buf[name:name+8])
			e := b.Service(i).Endpoint(j)
			e.SetWeight(2 * e.Weight())
		}
	}
	return nil
}

// loop never returns.
func loop(*abi.Batch) error {
	for {
	}
}

var sink [][]byte

// membomb allocates and writes until the memory limit stops it: it touches
// every 4 KiB page, so the host backs each one with real memory.
func membomb(*abi.Batch) error {
	for {
		b := make([]byte, 4<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		sink = append(sink, b)
	}
}

// garbage overwrites the batch with random bytes.
func garbage(b *abi.Batch) error {
	r := rand.New(rand.NewPCG(1, 2))
	buf := b.Bytes()
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	return nil
}

// record returns the offset of service i's record.
func record(b *abi.Batch, i int) int {
	buf := b.Bytes()
	p := abi.HeaderSize + 4*i
	return int(uint32(buf[p]) | uint32(buf[p+1])<<8 | uint32(buf[p+2])<<16 | uint32(buf[p+3])<<24)
}

// setAddress overwrites the 16-byte address at off.
func setAddress(b *abi.Batch, off int, a netip.Addr) {
	raw := netip.AddrFrom16(a.As16()).As16()
	copy(b.Bytes()[off:off+16], raw[:])
}

// firstEndpoint returns the offset of the first endpoint record of the
// first service that has one.
func firstEndpoint(b *abi.Batch) (int, bool) {
	buf := b.Bytes()
	for i := range b.Len() {
		if b.Service(i).Len() > 0 {
			rec := record(b, i)
			p := rec + 60
			return rec + int(uint32(buf[p])|uint32(buf[p+1])<<8|uint32(buf[p+2])<<16|uint32(buf[p+3])<<24), true
		}
	}
	return 0, false
}

// invent sends the first endpoint's traffic to an address not in the batch.
func invent(b *abi.Batch) error {
	if off, ok := firstEndpoint(b); ok {
		setAddress(b, off, netip.MustParseAddr("203.0.113.66"))
	}
	return nil
}

// readfile tries to read the host's /etc/passwd.
func readfile(b *abi.Batch) error {
	data, err := os.ReadFile("/etc/passwd")
	if err != nil {
		fmt.Fprintln(os.Stderr, "readfile failed:", err)
		return nil
	}
	fmt.Println(string(data))
	if off, ok := firstEndpoint(b); ok {
		setAddress(b, off, netip.AddrFrom4([4]byte{198, 51, 100, byte(len(data))}))
	}
	return nil
}

// addService claims the batch holds one more service than it does.
func addService(b *abi.Batch) error {
	buf := b.Bytes()
	buf[8]++
	return nil
}

// vip moves the first service's first cluster IP.
func vip(b *abi.Batch) error {
	if b.Len() > 0 && len(b.Service(0).ClusterIPs()) > 0 {
		setAddress(b, record(b, 0)+abi.ServiceHeaderSize, netip.MustParseAddr("203.0.113.77"))
	}
	return nil
}

// fail refuses the batch.
func fail(*abi.Batch) error {
	return errors.New("refusing the batch on purpose")
}

// chatty writes more than the host logs.
func chatty(*abi.Batch) error {
	long := make([]byte, 2000)
	for i := range long {
		long[i] = 'x'
	}
	fmt.Fprintln(os.Stderr, "chatty: a line of 2000 bytes follows")
	fmt.Fprintln(os.Stderr, string(long))
	for i := range 300 {
		fmt.Printf("chatty line %d\n", i)
	}
	return nil
}
