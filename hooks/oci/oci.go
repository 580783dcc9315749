// Package oci ships hook plugins as OCI artifacts: it pushes a plugin's
// .wasm to a container registry, resolves tags, pulls by digest into an
// on-disk cache and checks cosign-compatible signatures.
//
// A plugin artifact is an OCI image manifest (mediaType
// application/vnd.oci.image.manifest.v1+json) with artifactType
// ArtifactType, a config blob of ConfigMediaType holding "{}", and exactly
// one layer of WasmMediaType: the .wasm file, uncompressed. A signature is
// what cosign writes: an image manifest at tag sha256-HEX.sig in the same
// repository, one layer of SimpleSigningMediaType per signature, its
// payload the simple-signing JSON naming the artifact's manifest digest and
// its SignatureAnnotation the base64 ASN.1 ECDSA P-256 signature of the
// payload's SHA-256.
package oci

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Media types and annotations of the artifact layout.
const (
	// Scheme prefixes a plugin location held in a registry.
	Scheme = "oci://"
	// ArtifactType is the artifactType of a plugin's manifest.
	ArtifactType = "application/vnd.weir.plugin.v1"
	// ConfigMediaType is the media type of a plugin manifest's config blob.
	ConfigMediaType = "application/vnd.weir.plugin.config.v1+json"
	// WasmMediaType is the media type of the layer holding the .wasm file.
	WasmMediaType = "application/vnd.weir.plugin.wasm.v1"
	// SimpleSigningMediaType is the media type of a cosign signature layer.
	SimpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	// SignatureAnnotation holds a signature layer's base64 signature.
	SignatureAnnotation = "dev.cosignproject.cosign/signature"
)

// Size limits of what a pull reads.
const (
	// MaxWasmSize bounds a plugin's .wasm layer.
	MaxWasmSize = 256 << 20
	maxBlobSize = 1 << 20 // a signature payload or config blob
)

// IsLocation reports whether a plugin location names a registry artifact.
func IsLocation(location string) bool { return strings.HasPrefix(location, Scheme) }

// Ref is a parsed plugin location: oci://REGISTRY/REPO:TAG or
// oci://REGISTRY/REPO@sha256:DIGEST.
type Ref struct {
	location string
	repo     name.Repository
	tag      string // "" for a digest reference
	digest   string // "sha256:..." for a digest reference
}

// Parse reads a plugin location. The registry must be named, and a tag or
// a digest given.
func Parse(location string) (Ref, error) {
	rest, ok := strings.CutPrefix(location, Scheme)
	if !ok {
		return Ref{}, fmt.Errorf("%q does not start with %s", location, Scheme)
	}
	host, _, _ := strings.Cut(rest, "/")
	var err error
	if !strings.ContainsAny(host, ".:") && host != "localhost" || !strings.Contains(rest, "/") {
		return Ref{}, fmt.Errorf("%q names no registry; write %sREGISTRY/REPO:TAG, such as %sghcr.io/acme/plugin:v1", location, Scheme, Scheme)
	}
	last := rest[strings.LastIndex(rest, "/")+1:]
	if !strings.ContainsAny(last, ":@") {
		return Ref{}, fmt.Errorf("%q names no tag or digest; add :TAG or @sha256:DIGEST", location)
	}
	var ref name.Reference
	if strings.Contains(rest, "@") {
		ref, err = name.NewDigest(rest, name.StrictValidation)
	} else {
		ref, err = name.NewTag(rest, name.StrictValidation)
	}
	if err != nil {
		return Ref{}, fmt.Errorf("%q: %w (write %sREGISTRY/REPO:TAG or %sREGISTRY/REPO@sha256:DIGEST)", location, err, Scheme, Scheme)
	}
	r := Ref{location: location, repo: ref.Context()}
	switch ref := ref.(type) {
	case name.Digest:
		r.digest = ref.DigestStr()
	case name.Tag:
		r.tag = ref.TagStr()
	}
	return r, nil
}

// String returns the location as written.
func (r Ref) String() string { return r.location }

// Pinned reports whether the location names a digest, which never moves.
func (r Ref) Pinned() bool { return r.digest != "" }

// Repository returns the repository's full name, such as ghcr.io/acme/plugin.
func (r Ref) Repository() string { return r.repo.Name() }

// Client talks to registries for a plugin.
type Client struct {
	// Keychain supplies credentials; nil means anonymous access.
	Keychain authn.Keychain
	// PublicKey, when set, must have signed every artifact pulled.
	PublicKey *ecdsa.PublicKey
	// CacheDir holds pulled artifacts by digest; "" keeps none.
	CacheDir string
	// Transport carries the requests; nil means remote.DefaultTransport.
	Transport http.RoundTripper
}

// Artifact is a pulled plugin.
type Artifact struct {
	// Wasm is the plugin's module.
	Wasm []byte
	// Digest is the manifest's digest, sha256:HEX.
	Digest string
	// Cached says it was read from the cache, not the registry.
	Cached bool
}

// retries keeps a failing registry from holding a pull for long.
var retries = remote.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 2}

// options returns the remote options of one operation.
func (c *Client) options(ctx context.Context) []remote.Option {
	keychain := c.Keychain
	if keychain == nil {
		keychain = authn.NewMultiKeychain() // anonymous
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(keychain),
		remote.WithRetryBackoff(retries), remote.WithUserAgent("weir")}
	if c.Transport != nil {
		opts = append(opts, remote.WithTransport(c.Transport))
	}
	return opts
}

// Resolve returns the digest the location names now: its own digest, or
// the one its tag points at in the registry.
func (c *Client) Resolve(ctx context.Context, r Ref) (string, error) {
	if r.Pinned() {
		return r.digest, nil
	}
	desc, err := remote.Head(r.repo.Tag(r.tag), c.options(ctx)...)
	if err != nil {
		return "", fmt.Errorf("resolve tag %s: %w", r.tag, err)
	}
	return desc.Digest.String(), nil
}

// Pull returns the plugin whose manifest has digest, from the cache when
// it holds it, else from the registry (and caches it). With a PublicKey
// the signature is checked either way.
func (c *Client) Pull(ctx context.Context, r Ref, digest string) (*Artifact, error) {
	if a, err := c.pullCached(ctx, r, digest); a != nil || err != nil {
		return a, err
	}
	manifest, err := c.get(ctx, r.repo.Digest(digest))
	if err != nil {
		return nil, err
	}
	layer, err := pluginLayer(manifest)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", digest, err)
	}
	var sig *Signature
	if c.PublicKey != nil {
		if sig, err = c.verify(ctx, r, digest); err != nil {
			return nil, err
		}
	}
	wasm, err := c.blob(ctx, r.repo, layer, MaxWasmSize)
	if err != nil {
		return nil, fmt.Errorf("wasm layer: %w", err)
	}
	c.cache().store(digest, manifest, wasm, sig)
	return &Artifact{Wasm: wasm, Digest: digest}, nil
}

// pullCached returns the cached plugin of digest, verifying its signature
// (from the cache, else from the registry) when a key is configured; nil
// and no error when the cache does not hold it.
func (c *Client) pullCached(ctx context.Context, r Ref, digest string) (*Artifact, error) {
	wasm, sig := c.cache().load(digest)
	if wasm == nil || c.PublicKey == nil {
		if wasm == nil {
			return nil, nil
		}
		return &Artifact{Wasm: wasm, Digest: digest, Cached: true}, nil
	}
	if sig == nil || sig.check(c.PublicKey, digest) != nil {
		var err error
		if sig, err = c.verify(ctx, r, digest); err != nil {
			return nil, err
		}
		c.cache().storeSignature(digest, sig)
	}
	return &Artifact{Wasm: wasm, Digest: digest, Cached: true}, nil
}

// get fetches the manifest at ref, checking its digest when ref is one.
func (c *Client) get(ctx context.Context, ref name.Reference) ([]byte, error) {
	desc, err := remote.Get(ref, c.options(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("get manifest %s: %w", ref.Identifier(), err)
	}
	if d, ok := ref.(name.Digest); ok && digestOf(desc.Manifest) != d.DigestStr() {
		return nil, fmt.Errorf("manifest %s: the registry sent content of digest %s", d.DigestStr(), digestOf(desc.Manifest))
	}
	return desc.Manifest, nil
}

// pluginLayer checks that manifest is a plugin artifact and returns its
// wasm layer.
func pluginLayer(manifest []byte) (v1.Descriptor, error) {
	m, err := v1.ParseManifest(strings.NewReader(string(manifest)))
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("not an image manifest: %w", err)
	}
	if m.MediaType != "" && m.MediaType != types.OCIManifestSchema1 {
		return v1.Descriptor{}, fmt.Errorf("media type %s is not %s", m.MediaType, types.OCIManifestSchema1)
	}
	if m.ArtifactType != ArtifactType && m.Config.MediaType != ConfigMediaType {
		return v1.Descriptor{}, fmt.Errorf("not a Weir plugin: artifactType %q and config media type %q, want %s or %s",
			m.ArtifactType, m.Config.MediaType, ArtifactType, ConfigMediaType)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != WasmMediaType {
		return v1.Descriptor{}, fmt.Errorf("a plugin artifact has exactly one layer, of media type %s", WasmMediaType)
	}
	if m.Layers[0].Size > MaxWasmSize {
		return v1.Descriptor{}, fmt.Errorf("the wasm layer's %d bytes exceed the limit of %d", m.Layers[0].Size, MaxWasmSize)
	}
	return m.Layers[0], nil
}

// blob fetches the blob desc describes from repo, at most limit bytes,
// and checks its digest.
func (c *Client) blob(ctx context.Context, repo name.Repository, desc v1.Descriptor, limit int64) ([]byte, error) {
	if desc.Size > limit || desc.Digest.Algorithm != "sha256" {
		return nil, fmt.Errorf("blob %s: size %d or algorithm not accepted", desc.Digest, desc.Size)
	}
	layer, err := remote.Layer(repo.Digest(desc.Digest.String()), c.options(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	rc, err := layer.Compressed()
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, err)
	case int64(len(data)) > limit:
		return nil, fmt.Errorf("blob %s: larger than %d bytes", desc.Digest, limit)
	case digestOf(data) != desc.Digest.String():
		return nil, fmt.Errorf("blob %s: the registry sent content of digest %s", desc.Digest, digestOf(data))
	}
	return data, nil
}

// cache returns the client's artifact cache.
func (c *Client) cache() cache { return cache{dir: c.CacheDir} }

// Remember records that r's tag resolved to digest, for Remembered.
func (c *Client) Remember(r Ref, digest string) {
	if !r.Pinned() {
		c.cache().storeTag(r.location, digest)
	}
}

// Remembered returns the digest r last resolved to, as recorded in the
// cache, so that a plugin loads while its registry cannot be reached.
func (c *Client) Remembered(r Ref) (string, bool) {
	if r.Pinned() {
		return r.digest, true
	}
	return c.cache().loadTag(r.location)
}

// digestOf returns the sha256 digest of data, sha256:HEX.
func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ErrUnsigned is wrapped by the error of a pull that found no signature
// where a public key requires one.
var ErrUnsigned = errors.New("no signature")
