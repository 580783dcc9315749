package hooks

import (
	"fmt"
	"time"
)

// Quarantine: after quarantineAfter consecutive failed calls a plugin is
// not called for a backoff that starts at firstBackoff and doubles after
// each failed trial call, up to maxBackoff.
const (
	quarantineAfter = 3
	firstBackoff    = 10 * time.Second
	maxBackoff      = 5 * time.Minute
)

// health tracks a plugin's consecutive failures and its quarantine.
type health struct {
	fails   int
	backoff time.Duration // 0 when not quarantined
	until   time.Time
}

// quarantined reports whether the plugin must not be called at now. Once
// the backoff has passed it returns false and the next call is the trial.
func (h *health) quarantined(now time.Time) bool {
	return h.backoff > 0 && now.Before(h.until)
}

// succeeded records a good call and reports whether it ended a quarantine.
func (h *health) succeeded() (recovered bool) {
	recovered = h.backoff > 0
	*h = health{}
	return recovered
}

// failed records a failed call and reports whether it put the plugin in
// quarantine: the quarantineAfter-th failure in a row starts one, and a
// failed trial call (the first call after a backoff) starts the next, twice
// as long. A call that fails while the plugin is quarantined (another call
// of the same sync) only counts.
func (h *health) failed(now time.Time) (quarantined bool) {
	h.fails++
	switch {
	case h.quarantined(now):
		return false
	case h.backoff > 0:
		h.backoff = min(2*h.backoff, maxBackoff)
	case h.fails >= quarantineAfter:
		h.backoff = firstBackoff
	default:
		return false
	}
	h.until = now.Add(h.backoff)
	return true
}

// err says why a quarantined plugin was not called.
func (h *health) err() error {
	return fmt.Errorf("quarantined until %s after %d consecutive failed calls",
		h.until.Format(time.RFC3339), h.fails)
}
