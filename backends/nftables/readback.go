package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/sdk/plan"
	"golang.org/x/sys/unix"
)

var _ backends.Reader = (*Backend)(nil)

// readAttempts bounds how often ReadBack starts over because a commit
// (Weir's or another process's) changed the ruleset while it was reading.
const readAttempts = 5

// ReadBack lists Weir's tables over netlink and rebuilds from what the
// kernel holds, never from what the backend remembers, how each
// destination is forwarded; see backends.Reader. It reads on a socket of
// its own, so it neither waits for nor delays a sync, and it starts over
// when the ruleset's generation changed during the read.
func (b *Backend) ReadBack(ctx context.Context) (*backends.View, error) {
	connOpts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(primeDumps)}
	if b.opts.NetNS != 0 {
		connOpts = append(connOpts, nftables.WithNetNSFd(b.opts.NetNS))
	}
	conn, err := nftables.New(connOpts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: open netlink socket for reading: %w", err)
	}
	defer b.closeReader(conn.CloseLasting)
	nc, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: b.opts.NetNS})
	if err != nil {
		return nil, fmt.Errorf("nftables: open netlink socket for reading: %w", err)
	}
	defer b.closeReader(nc.Close)
	if err := forceBuffers(nc); err != nil {
		return nil, fmt.Errorf("nftables: size netlink socket buffers: %w", err)
	}
	for range readAttempts {
		dumps, again, err := b.readTables(ctx, conn, nc)
		if err != nil || !again {
			return b.view(dumps), err
		}
	}
	return nil, fmt.Errorf("nftables: read back tables ip/ip6 %s: the ruleset changed during each of %d reads", b.opts.Table, readAttempts)
}

// closeReader closes a socket ReadBack read on. What was read stands
// whatever the close returns, so a failure is logged, not returned: it only
// means a descriptor may stay open.
func (b *Backend) closeReader(closeSocket func() error) {
	if err := closeSocket(); err != nil {
		b.log.Warn("nftables: closing a read-back netlink socket failed", "error", err)
	}
}

// readTables reads both tables; again is set when the ruleset's generation
// changed meanwhile, so they may not be of one commit.
func (b *Backend) readTables(ctx context.Context, conn *nftables.Conn, nc *netlink.Conn) (dumps []*tableDump, again bool, err error) {
	before, err := generation(nc)
	if err != nil {
		return nil, false, err
	}
	dumps = make([]*tableDump, len(b.tables))
	for i, tb := range b.tables {
		if dumps[i], err = readTable(ctx, conn, nc, tb.layout.table); err != nil {
			return nil, false, fmt.Errorf("nftables: read back %s: %w", tableName(tb.layout), err)
		}
	}
	after, err := generation(nc)
	if err != nil {
		return nil, false, err
	}
	return dumps, before != after, nil
}

// Expected returns the view ReadBack must return once p is committed: the
// families whose node ports this backend serves follow nodePortAddresses
// and, with the primary addresses, the plan's Node.
func (b *Backend) Expected(p *plan.Plan) (*backends.View, map[backends.Destination]plan.Key) {
	var fams []int
	for _, tb := range b.tables {
		if tb.layout.servesNodePorts(p.Node.Addresses) {
			fams = append(fams, tb.layout.fam.number())
		}
	}
	return backends.Expect(p, backends.ExpectOptions{NodePortFamilies: fams})
}

// view interprets the dumps of both tables; nil without dumps.
func (b *Backend) view(dumps []*tableDump) *backends.View {
	if dumps == nil {
		return nil
	}
	v := &backends.View{Destinations: map[backends.Destination]backends.Forwarding{}}
	for i, tb := range b.tables {
		newReader(tb.layout, dumps[i], v).read()
	}
	return v
}

// tableDump is what one table holds, as read from the kernel.
type tableDump struct {
	exists bool
	chains map[string]*nftables.Chain
	rules  map[string][]*nftables.Rule
	sets   map[string]*nftables.Set
	elems  map[string][]nftables.SetElement
}

// readTable lists the table's chains with their rules and its sets with
// their elements, except the endpoints maps, whose buckets it asks for on
// nc by key.
func readTable(ctx context.Context, conn *nftables.Conn, nc *netlink.Conn, table *nftables.Table) (*tableDump, error) {
	d := &tableDump{chains: map[string]*nftables.Chain{}, rules: map[string][]*nftables.Rule{},
		sets: map[string]*nftables.Set{}, elems: map[string][]nftables.SetElement{}}
	tables, err := conn.ListTablesOfFamily(table.Family)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	d.exists = slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == table.Name })
	if !d.exists {
		return d, nil
	}
	if err := d.readChains(ctx, conn, table); err != nil {
		return nil, err
	}
	if err := d.readSets(ctx, conn, table); err != nil {
		return nil, err
	}
	return d, d.readBuckets(nc, table)
}

func (d *tableDump) readChains(ctx context.Context, conn *nftables.Conn, table *nftables.Table) error {
	chains, err := conn.ListChainsOfTableFamily(table.Family)
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name != table.Name {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rules, err := conn.GetRules(table, c)
		if err != nil {
			return fmt.Errorf("list rules of chain %s: %w", c.Name, err)
		}
		d.chains[c.Name], d.rules[c.Name] = c, rules
	}
	return nil
}

func (d *tableDump) readSets(ctx context.Context, conn *nftables.Conn, table *nftables.Table) error {
	sets, err := conn.GetSets(table)
	if err != nil {
		return fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		if err := ctx.Err(); err != nil {
			return err
		}
		d.sets[s.Name] = s
		if _, buckets := parseEndpointsMap(s.Name); buckets || unread[s.Name] {
			continue
		}
		elems, err := conn.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("list elements of %s: %w", s.Name, err)
		}
		d.elems[s.Name] = elems
	}
	return nil
}

// unread are the sets whose elements no destination's forwarding depends
// on (masquerading and affinity entries), which ReadBack does not list: the
// hairpin set alone holds an element per endpoint address.
var unread = map[string]bool{setHairpin: true, setAffinity: true, setClusterCIDRs: true, setPodCIDRs: true}

// dumpPart is the largest part of a dump the kernel sends in one message:
// it sizes them by the largest read the socket has seen, up to 32 KiB
// (netlink_recvmsg), and the netlink library reads a page at first. Large
// parts matter: the kernel walks a hash set from its start for every part
// of its dump, so 100k elements in parts of 4 KiB took 8 s.
const dumpPart = 32 << 10

// primeDumps raises c's buffers and reads the answer to a small request
// with a dumpPart-sized buffer, so the kernel sends later dumps in parts
// that large.
func primeDumps(c *netlink.Conn) error {
	if err := forceBuffers(c); err != nil {
		return err
	}
	if _, err := c.Send(generationRequest()); err != nil {
		return err
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, dumpPart)
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		_, _, _, _, rerr = unix.Recvmsg(int(fd), buf, nil, 0)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	return errors.Join(err, rerr)
}

func generationRequest() netlink.Message {
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	}
}

// generation returns the nf_tables ruleset generation, which every commit
// increments.
func generation(c *netlink.Conn) (uint32, error) {
	msgs, err := c.Execute(generationRequest())
	if err != nil {
		return 0, fmt.Errorf("nftables: read the ruleset generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("nftables: read the ruleset generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("nftables: read the ruleset generation: the kernel's answer has none")
}

func tableName(l *layout) string { return "table " + l.fam.kw + " " + l.table.Name }
