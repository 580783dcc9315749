// Command hostile is a test plugin that misbehaves in the way its config
// ({"mode": "..."}) names, to show that Weir contains it. It misbehaves only
// on batches holding a service annotated hostile.weir.dev/act: "true" and
// returns the others unchanged, so a test can show that the next call
// works. Mode "report" is well-behaved: it prints each batch's size and
// Full flag.
package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"

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
	mode, reporting = modes[c.Mode], c.Mode == "report"
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
