// Command affinity is a Weir hook plugin that sets, overrides or clears a
// service's ClientIP session affinity, and its scheduler hint, from Service
// annotations:
//
//	affinity.weir.dev/client-ip: "30m"
//	affinity.weir.dev/scheduler: "sh"
//
// See README.md.
package main

import (
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/guest"
	"github.com/weirproxy/weir/sdk/plan"
)

// The annotations the plugin reads.
const (
	clientIPAnnotation  = "affinity.weir.dev/client-ip"
	schedulerAnnotation = "affinity.weir.dev/scheduler"
)

// config is the plugin's configuration as Weir hands it over.
type config struct {
	// DefaultTimeoutSeconds is the timeout "true" or "on" turns affinity on with.
	DefaultTimeoutSeconds uint32 `json:"defaultTimeoutSeconds"`
	// Scheduler is the hint set on services the annotation gives affinity,
	// unless their scheduler annotation says otherwise; "" leaves it alone.
	Scheduler string `json:"scheduler"`
}

var (
	current = config{DefaultTimeoutSeconds: 10800}
	// logOut receives one line per service whose annotation is rejected.
	logOut io.Writer = os.Stderr
	// plugin is what init registers; tests run it through sdktest.
	plugin = guest.Plugin{Configure: configure, Process: process}
)

func init() { guest.Register(plugin) }

func main() {}

// configure parses and checks the configuration; with none the defaults apply.
func configure(raw []byte) error {
	c := config{DefaultTimeoutSeconds: 10800}
	if err := guest.DecodeConfig(raw, &c); err != nil {
		return err
	}
	if c.DefaultTimeoutSeconds < 1 || c.DefaultTimeoutSeconds > abi.MaxAffinitySeconds {
		return errors.New("defaultTimeoutSeconds: " + strconv.FormatUint(uint64(c.DefaultTimeoutSeconds), 10) +
			" is not between 1 and " + strconv.Itoa(abi.MaxAffinitySeconds))
	}
	sched, err := parseScheduler(c.Scheduler)
	if err != nil {
		return errors.New("scheduler: " + err.Error())
	}
	c.Scheduler = string(sched)
	current = c
	return nil
}

// process applies the annotations of every service; a service with an
// invalid one is left unchanged.
func process(b *abi.Batch) error {
	for i := range b.Len() {
		if err := annotate(b.Service(i), &current); err != nil {
			return err
		}
	}
	return nil
}

// annotate applies one service's annotations. A bad annotation is logged
// and leaves the service alone; the error is for a scheduler the ABI refuses.
func annotate(s abi.Service, c *config) error {
	av, hasAffinity := s.Annotation(clientIPAnnotation)
	sv, hasScheduler := s.Annotation(schedulerAnnotation)
	var seconds uint32
	var sched plan.Scheduler
	var err error
	if hasAffinity {
		if seconds, err = parseAffinity(av, s.AffinitySeconds(), c.DefaultTimeoutSeconds); err != nil {
			warn(s, clientIPAnnotation, av, err)
			return nil
		}
	}
	if hasScheduler {
		if sched, err = parseScheduler(sv); err != nil {
			warn(s, schedulerAnnotation, sv, err)
			return nil
		}
	} else if hasAffinity && seconds > 0 && c.Scheduler != "" {
		sched, hasScheduler = plan.Scheduler(c.Scheduler), true
	}
	if hasAffinity {
		s.SetAffinity(seconds)
	}
	if hasScheduler {
		return s.SetScheduler(sched)
	}
	return nil
}

// parseAffinity reads the client-ip annotation: on/true (the service's own
// timeout if it has one, else the default), off/false (0), or a timeout of
// 1s to 24h as a bare number of seconds or a Go duration ("30m", "1h30m").
func parseAffinity(v string, current, def uint32) (uint32, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true", "on":
		if current > 0 {
			return current, nil
		}
		return def, nil
	case "false", "off":
		return 0, nil
	}
	d, err := parseSeconds(strings.TrimSpace(v))
	switch {
	case err != nil:
		return 0, err
	case d%time.Second != 0:
		return 0, errors.New("timeout is not a whole number of seconds")
	case d < time.Second:
		return 0, errors.New("timeout must be at least 1s (use \"false\" to turn affinity off)")
	case d > abi.MaxAffinitySeconds*time.Second:
		return 0, errTooLong
	}
	return uint32(d / time.Second), nil
}

// errTooLong rejects a timeout Kubernetes would not accept.
var errTooLong = errors.New("timeout is longer than 86400s (24h), the most Kubernetes allows")

// parseSeconds reads a bare number of seconds or a Go duration.
func parseSeconds(v string) (time.Duration, error) {
	if v != "" && strings.Trim(v, "0123456789") == "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n > abi.MaxAffinitySeconds {
			return 0, errTooLong
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errors.New("not true, on, false, off, a number of seconds or a duration like 30m")
	}
	return d, nil
}

// parseScheduler reads a scheduler name as IPVS spells it; "" and
// "default" are the backend's default.
func parseScheduler(v string) (plan.Scheduler, error) {
	v = strings.ToLower(strings.TrimSpace(v))
	if v == "default" {
		return plan.SchedulerDefault, nil
	}
	for _, s := range plan.Schedulers {
		if string(s) == v {
			return s, nil
		}
	}
	return "", errors.New("unknown scheduler " + strconv.Quote(v) + " (want default, rr, wrr, lc, wlc, sh or mh)")
}

// warn logs a rejected annotation of service s.
func warn(s abi.Service, key, v string, err error) {
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	_, _ = io.WriteString(logOut, s.Key().String()+": annotation "+key+"="+strconv.Quote(v)+": "+
		err.Error()+"; service left unchanged\n")
}
