// Package nsenter runs code inside another network namespace without moving
// the calling goroutine's thread.
package nsenter

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// OnThread runs fn on a fresh, locked OS thread and afterwards switches the
// thread back to the network namespace it started in. If that fails, the
// thread stays locked, so the runtime discards it with its goroutine.
func OnThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current network namespace: %w", err)
			return
		}
		defer orig.Close()
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			errc <- errors.Join(err, fmt.Errorf("restore network namespace: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Do runs fn inside the network namespace open as nsFd, on its own thread.
func Do(nsFd int, fn func() error) error {
	return OnThread(func() error {
		if err := netns.Set(netns.NsHandle(nsFd)); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return fn()
	})
}
