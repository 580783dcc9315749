package iptables

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// A stamp tells, in one cheap call, whether anything changed in a
// family's tables since the backend's last sync: then the periodic look
// (look.go) is not needed. With iptables-nft it is the nftables ruleset
// generation, which every commit of anyone in the network namespace
// increments; with iptables-legacy the number of entries and the size of
// the nat and filter blobs (GET_INFO). Neither tells Weir's own writes
// from anyone else's, so a stamp vouches only for tables that nothing
// changed since Weir last looked at them (see restamp): after a sync that
// wrote, the next reconcile looks.

// stamp identifies the state of a family's tables.
type stamp struct {
	// gen is the nftables generation (iptables-nft).
	gen uint32
	// entries and size are those of the filter and the nat blob
	// (iptables-legacy).
	entries, size [2]uint32
}

// committer is who made the last nftables commit, for the log: "pid 12
// (nft)"; "" when unknown or for iptables-legacy.
type committer string

// takeStamp returns the current stamp of family f's tables.
func (b *Backend) takeStamp(f ipFamily) (stamp, committer, error) {
	if b.fl.name == flavourNFT {
		return nftGeneration(b.opts.NetNS)
	}
	layout := blob4
	if f == ipv6 {
		layout = blob6
	}
	var st stamp
	err := inNetNS(b.opts.NetNS, func() error {
		fd, err := unix.Socket(layout.socketFamily, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		for i, table := range []string{tableFilter, tableNAT} {
			info, err := getInfo(fd, layout, table)
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
			st.entries[i], st.size[i] = info.entries, info.size
		}
		return nil
	})
	return st, "", err
}

// The nf_tables generation message (NFT_MSG_GETGEN, NFT_MSG_NEWGEN) and
// its attributes.
const (
	nftGetGen       = 16
	nftNewGen       = 15
	attrGenID       = 1 // NFTA_GEN_ID
	attrGenProcPID  = 2 // NFTA_GEN_PROC_PID
	attrGenProcName = 3 // NFTA_GEN_PROC_NAME
)

// nftGeneration returns the nftables generation of netNS and who made its
// last commit.
func nftGeneration(netNS int) (stamp, committer, error) {
	var st stamp
	var who committer
	err := inNetNS(netNS, func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		defer unix.Close(fd)
		c := &nlDump{fd: fd, buf: make([]byte, 4096)}
		found := false
		err = c.request(nftGetGen, unix.NFPROTO_UNSPEC, func(msgType uint16, attrs []byte) {
			id := attrGet(attrs, attrGenID)
			if msgType != nftSubsys|nftNewGen || len(id) != 4 {
				return
			}
			st.gen, found = binary.BigEndian.Uint32(id), true
			if pid := attrGet(attrs, attrGenProcPID); len(pid) == 4 {
				who = committer(fmt.Sprintf("pid %d (%s)", binary.BigEndian.Uint32(pid), attrString(attrs, attrGenProcName)))
			}
		})
		if err == nil && !found {
			err = errors.New("no generation in the answer")
		}
		return err
	})
	if err != nil {
		return stamp{}, "", fmt.Errorf("nftables generation: %w", err)
	}
	return st, who, nil
}
