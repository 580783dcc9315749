package hooks

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Reloads wait until a plugin's directory has been quiet for debounce, but
// no longer than maxDelay after the first event.
const (
	debounce = 100 * time.Millisecond
	maxDelay = time.Second
)

// Watch reloads plugin files when they change, until ctx is done. It
// watches the directories holding them, so atomic renames and ConfigMap
// symlink swaps are seen. It resolves the tags of oci:// plugins again
// every RefreshInterval and reloads a plugin whose tag moved. A new version
// that fails to load is logged and the previous one keeps serving.
func (c *Chain) Watch(ctx context.Context) error {
	ctx, stopPolls := context.WithCancel(ctx)
	polls := c.pollRegistries(ctx)
	defer func() { stopPolls(); polls.Wait() }()
	dirs := map[string][]*slot{}
	for _, s := range c.slots {
		if s.oci != nil {
			continue
		}
		path, err := filepath.Abs(s.Path)
		if err != nil {
			return fmt.Errorf("plugin %q: %w", s.Name, err)
		}
		dir := filepath.Dir(path)
		dirs[dir] = append(dirs[dir], s)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch plugin files: %w", err)
	}
	defer w.Close()
	for dir, slots := range dirs {
		if err := w.Add(dir); err != nil {
			c.log.Warn("Cannot watch plugin directory; its plugins will not be reloaded",
				"dir", dir, "plugin", slots[0].Name, "error", err)
		}
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	pending := map[string]bool{}
	var first time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("watch plugin files: watcher closed")
			}
			dir := filepath.Dir(ev.Name)
			if ev.Op == fsnotify.Chmod || dirs[dir] == nil {
				continue
			}
			now := time.Now()
			if len(pending) == 0 {
				first = now
			}
			pending[dir] = true
			timer.Reset(max(min(debounce, maxDelay-now.Sub(first)), 0))
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("watch plugin files: watcher closed")
			}
			c.log.Warn("Plugin file watch error", "error", err)
		case <-timer.C:
			for dir := range pending {
				for _, s := range dirs[dir] {
					c.reload(ctx, s)
				}
			}
			clear(pending)
		}
	}
}

// reload loads the plugin's file again if it changed and swaps it in.
func (c *Chain) reload(ctx context.Context, s *slot) {
	c.loadMu.Lock()
	defer c.loadMu.Unlock()
	c.mu.Lock()
	closed, current, lastFailed := c.closed, "", s.failedSHA
	if s.p != nil {
		current = s.p.sha
	}
	c.mu.Unlock()
	if closed {
		return
	}
	keep := "Keeping the previous plugin version"
	if current == "" {
		keep = "Plugin still not loaded; its services pass through"
	}
	data, sum, err := fetch(ctx, s.settings)
	if err != nil {
		c.log.Warn(keep, "plugin", s.Name, "error", err)
		if s.oci != nil {
			c.pullFailed(s.Name, err)
		}
		return
	}
	if sum == current || sum == lastFailed {
		return
	}
	p, err := load(ctx, s.settings, data, sum, &c.mods, c.cache, c.log)
	if err != nil {
		c.mu.Lock()
		s.failedSHA = sum
		c.mu.Unlock()
		c.log.Error(keep, "plugin", s.Name, "sha256", sum, "error", err)
		return
	}
	c.mu.Lock()
	old := s.p
	if s.health.backoff > 0 && c.opts.Observer != nil {
		c.opts.Observer.PluginQuarantined(s.Name, false) // a new version starts afresh
	}
	s.p, s.failedSHA, s.health = p, "", health{}
	c.flush(s.index)
	c.mu.Unlock()
	if old != nil {
		if err := old.close(); err != nil {
			c.log.Warn("Closing the previous plugin version failed", "plugin", s.Name, "error", err)
		}
	}
	c.log.Info("Reloaded plugin", "plugin", s.Name, "path", s.Path, "sha256", sum)
	if c.opts.OnReload != nil {
		c.opts.OnReload()
	}
}
