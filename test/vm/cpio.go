package vm

import (
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
)

// entry is one file of an initramfs: a directory, a regular file or a
// symbolic link (target set).
type entry struct {
	name   string // without a leading slash
	mode   fs.FileMode
	data   []byte
	target string
}

// writeCPIO writes entries as a cpio archive in the "newc" format the
// kernel unpacks as an initramfs, in name order so parents precede their
// children, ending with the TRAILER!!! record.
func writeCPIO(w io.Writer, entries []entry) error {
	sorted := append([]entry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	cw := &cpioWriter{w: w}
	for i, e := range sorted {
		cw.record(uint32(i+1), e)
	}
	cw.record(0, entry{name: "TRAILER!!!"})
	return cw.err
}

// cpioWriter writes newc records, remembering the first error.
type cpioWriter struct {
	w   io.Writer
	n   int64
	err error
}

// record writes one header, name and body, each padded to 4 bytes.
func (c *cpioWriter) record(ino uint32, e entry) {
	body := e.data
	var mode uint32
	switch {
	case e.mode.IsDir():
		mode = 0o040000
	case e.mode&fs.ModeSymlink != 0:
		mode, body = 0o120000, []byte(e.target)
	case e.name != "TRAILER!!!":
		mode = 0o100000
	}
	mode |= uint32(e.mode.Perm())
	nlink := 1
	if e.mode.IsDir() {
		nlink = 2
	}
	name := strings.TrimPrefix(e.name, "/") + "\x00"
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check.
	c.write([]byte(fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(body), 0, 0, 0, 0, len(name), 0)))
	c.write([]byte(name))
	c.pad()
	c.write(body)
	c.pad()
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

// pad writes zeros up to the next multiple of 4 bytes.
func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}
