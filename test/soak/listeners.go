package soak

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// nodePortListeners counts the TCP sockets listening, in the network
// namespace of process pid, on ports of the node-port range: the
// health-check node ports Weir serves, one goroutine each. Their number
// follows the services (externalTrafficPolicy Local load balancers), not a
// leak, so the goroutine growth target discounts them.
func nodePortListeners(pid int) (int, error) {
	n := 0
	for _, f := range []string{"tcp", "tcp6"} {
		c, err := countListening(fmt.Sprintf("/proc/%d/net/%s", pid, f), 30000, 32767)
		if err != nil {
			return 0, err
		}
		n += c
	}
	return n, nil
}

// countListening counts the sockets of a /proc/net/tcp-style table in
// state LISTEN (0A) with a local port from lo to hi.
func countListening(path string, lo, hi uint64) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" {
			continue
		}
		_, port, ok := strings.Cut(fields[1], ":")
		p, err := strconv.ParseUint(port, 16, 16)
		if ok && err == nil && p >= lo && p <= hi {
			n++
		}
	}
	return n, sc.Err()
}
