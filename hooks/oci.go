package hooks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/weirproxy/weir/hooks/oci"
)

// RegistryObserver is an optional capability of an Observer, checked by
// type assertion: it is told when an oci:// plugin's tag could not be
// resolved again or its new version could not be pulled. The loaded
// version keeps serving.
type RegistryObserver interface {
	// PluginPullFailed reports one failed resolve or pull.
	PluginPullFailed(plugin string, err error)
}

// pullTimeout bounds one resolve and pull of a plugin.
const pullTimeout = 2 * time.Minute

// startResolveTimeout bounds the resolve of a tag while no version is
// loaded (at start): a registry that does not answer then delays the
// first sync by seconds, not minutes, and the cached version loads if
// there is one. A test shortens it.
var startResolveTimeout = 5 * time.Second

// ociSource is where an oci:// plugin comes from: its location, the
// registry client and the digest it last pulled.
type ociSource struct {
	name   string
	ref    oci.Ref
	client *oci.Client
	log    *slog.Logger

	mu     sync.Mutex
	digest string // the manifest digest last pulled; "" before the first
}

// newOCISource sets up the registry client of c, which Check passed and
// whose Path is an oci:// location. The artifacts are cached under
// opts.CacheDir/oci.
func newOCISource(c Config, opts Options) (*ociSource, error) {
	ref, err := oci.Parse(c.Path)
	if err != nil {
		return nil, fmt.Errorf("plugin %q: path: %w", c.Name, err)
	}
	client := &oci.Client{}
	if c.DockerConfig != "" {
		client.Keychain = oci.DockerConfig{Path: c.DockerConfig}
	}
	if c.PublicKey != "" {
		if client.PublicKey, err = oci.LoadPublicKey(c.PublicKey); err != nil {
			return nil, fmt.Errorf("plugin %q: publicKey: %w", c.Name, err)
		}
	}
	if opts.CacheDir != "" {
		client.CacheDir = filepath.Join(opts.CacheDir, "oci")
	}
	return &ociSource{name: c.Name, ref: ref, client: client, log: opts.Log}, nil
}

// badLocation reports whether path is an oci:// location that does not parse.
func badLocation(path string) bool {
	if !oci.IsLocation(path) {
		return false
	}
	_, err := oci.Parse(path)
	return err != nil
}

// fetch returns a plugin's module, from its file or its registry, with
// its hex sha256.
func fetch(ctx context.Context, s *settings) ([]byte, string, error) {
	if s.oci == nil {
		return readFile(s)
	}
	a, err := s.oci.pull(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("plugin %q: %s: %w", s.Name, s.Path, err)
	}
	sum := sha256.Sum256(a.Wasm)
	return a.Wasm, hex.EncodeToString(sum[:]), nil
}

// pull resolves the location and pulls what it names. While no version
// has been pulled, a registry that cannot be reached falls back to the
// digest the tag last named, from the cache, so that a restart does not
// depend on the registry.
func (o *ociSource) pull(ctx context.Context) (*oci.Artifact, error) {
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	starting := o.loaded() == ""
	remembered, ok := o.client.Remembered(o.ref)
	fallback := ok && starting
	resolveCtx, cancelResolve := ctx, context.CancelFunc(func() {})
	if starting {
		resolveCtx, cancelResolve = context.WithTimeout(ctx, startResolveTimeout)
	}
	digest, err := o.client.Resolve(resolveCtx, o.ref)
	cancelResolve()
	if err != nil {
		if !fallback {
			return nil, err
		}
		o.log.Warn("Cannot resolve the plugin's tag; using the digest it last named, from the cache",
			"plugin", o.name, "location", o.ref, "digest", remembered, "error", err)
		digest = remembered
	}
	a, err := o.client.Pull(ctx, o.ref, digest)
	if err != nil {
		return nil, err
	}
	o.client.Remember(o.ref, digest)
	o.mu.Lock()
	o.digest = digest
	o.mu.Unlock()
	o.log.Info("Pulled plugin", "plugin", o.name, "location", o.ref, "digest", digest, "cached", a.Cached,
		"signed", o.client.PublicKey != nil)
	return a, nil
}

// loaded returns the digest last pulled; "" before the first pull.
func (o *ociSource) loaded() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.digest
}

// pollRegistries starts polling the tag of every oci:// plugin until ctx
// is done; wait on the result after canceling ctx.
func (c *Chain) pollRegistries(ctx context.Context) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, s := range c.slots {
		if s.oci != nil {
			wg.Go(func() { c.poll(ctx, s) })
		}
	}
	return &wg
}

// poll refreshes s every RefreshInterval until ctx is done.
func (c *Chain) poll(ctx context.Context, s *slot) {
	t := time.NewTicker(s.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.refresh(ctx, s)
		}
	}
}

// refresh reloads s when its tag names another digest than the one
// pulled, or when none was pulled yet. A digest location is pulled once.
func (c *Chain) refresh(ctx context.Context, s *slot) {
	loaded := s.oci.loaded()
	if loaded == "" {
		c.reload(ctx, s)
		return
	}
	if s.oci.ref.Pinned() {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, pullTimeout)
	digest, err := s.oci.client.Resolve(rctx, s.oci.ref)
	cancel()
	switch {
	case ctx.Err() != nil:
	case err != nil:
		c.log.Warn("Keeping the loaded plugin version: cannot resolve its tag", "plugin", s.Name,
			"location", s.Path, "digest", loaded, "error", err)
		c.pullFailed(s.Name, err)
	case digest != loaded:
		c.log.Info("Plugin tag moved", "plugin", s.Name, "location", s.Path, "from", loaded, "to", digest)
		c.reload(ctx, s)
	}
}

// pullFailed tells the observer, when it wants to know, of a failed
// resolve or pull.
func (c *Chain) pullFailed(plugin string, err error) {
	if o, ok := c.opts.Observer.(RegistryObserver); ok {
		o.PluginPullFailed(plugin, err)
	}
}
