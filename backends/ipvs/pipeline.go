package ipvs

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// applyBatch sends ops to the kernel in one pipeline (genlConn.pipeline)
// and records in programmed those it took, with apply's rules: adding
// what exists updates it, deleting what is gone succeeds. Ops reach the
// kernel in order on one socket, but unlike applyAll's one-by-one sends
// an op after a failed one of the same virtual server is still sent; the
// kernel refuses those that depended on it, and any it took are recorded.
// The error names the first failed op and counts the others.
func applyBatch(c *genlConn, programmed map[vsKey]*virtualServer, ops []op, now time.Time) error {
	if len(ops) == 0 {
		return nil
	}
	first := c.seq + 1
	reqs := make([][]byte, len(ops))
	buf := make([]byte, 0, 192*len(ops))
	for i, o := range ops {
		at := len(buf)
		buf = appendOp(buf, c.family, c.nextSeq(), o, false)
		reqs[i] = buf[at:len(buf):len(buf)]
	}
	results, err := c.pipeline(reqs, first)
	var errs []error
	for i, res := range results {
		o := ops[i]
		if res = c.settle(o, res); res != nil {
			errs = append(errs, fmt.Errorf("ipvs: %s: %w", o, res))
			continue
		}
		record(programmed, o, now)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("%w (%d of %d IPVS changes unconfirmed)", err, len(ops)-len(results), len(ops)))
	}
	return firstOf(errs)
}

// settle turns the kernel's answer res to o into the op's outcome: an add
// answered EEXIST is sent again as an update, on its own, and a delete of
// something gone is done.
func (c *genlConn) settle(o op, res error) error {
	switch {
	case res == nil:
		return nil
	case (o.kind == opAddVS || o.kind == opAddRS) && errors.Is(res, unix.EEXIST):
		return c.one(o, true)
	case o.kind == opDelVS || o.kind == opDelRS:
		return ignoreGone(res)
	}
	return res
}

// one sends a single op (retry: as the update of an add) and waits for
// its answer.
func (c *genlConn) one(o op, retry bool) error {
	seq := c.nextSeq()
	errs, err := c.pipeline([][]byte{appendOp(nil, c.family, seq, o, retry)}, seq)
	if err != nil {
		return err
	}
	return errs[0]
}
