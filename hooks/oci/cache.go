package oci

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
)

// cache keeps pulled artifacts on disk by manifest digest:
//
//	DIR/sha256/HEX/manifest.json   the manifest, as the registry sent it
//	DIR/sha256/HEX/plugin.wasm     its layer
//	DIR/sha256/HEX/signature.json  the signature that verified, if any
//	DIR/tags/HEX                   the digest a location's tag last named (HEX: sha256 of the location)
//
// Every read is checked: the manifest against its digest, the wasm against
// the manifest. A damaged or partial entry is a miss, and writing is best
// effort: a cache that cannot be written only costs a pull.
type cache struct{ dir string }

// entry returns the folder of a digest's artifact; "" without a cache or
// for a digest that is not sha256:HEX.
func (c cache) entry(digest string) string {
	hexDigest, ok := strings.CutPrefix(digest, "sha256:")
	if c.dir == "" || !ok || len(hexDigest) != 64 || strings.Trim(hexDigest, "0123456789abcdef") != "" {
		return ""
	}
	return filepath.Join(c.dir, "sha256", hexDigest)
}

// load returns the cached wasm of digest, nil on a miss, and the cached
// signature, nil when there is none.
func (c cache) load(digest string) ([]byte, *Signature) {
	dir := c.entry(digest)
	if dir == "" {
		return nil, nil
	}
	manifest, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil || digestOf(manifest) != digest {
		return nil, nil
	}
	layer, err := pluginLayer(manifest)
	if err != nil {
		return nil, nil
	}
	wasm, err := os.ReadFile(filepath.Join(dir, "plugin.wasm"))
	if err != nil || digestOf(wasm) != layer.Digest.String() {
		return nil, nil
	}
	var sig *Signature
	if data, err := os.ReadFile(filepath.Join(dir, "signature.json")); err == nil {
		sig = &Signature{}
		if json.Unmarshal(data, sig) != nil {
			sig = nil
		}
	}
	return wasm, sig
}

// store caches an artifact and its signature, nil when none was checked.
func (c cache) store(digest string, manifest, wasm []byte, sig *Signature) {
	dir := c.entry(digest)
	if dir == "" || os.MkdirAll(dir, 0o755) != nil {
		return
	}
	if writeAtomic(filepath.Join(dir, "plugin.wasm"), wasm) == nil {
		_ = writeAtomic(filepath.Join(dir, "manifest.json"), manifest)
	}
	c.storeSignature(digest, sig)
}

// storeSignature caches the signature that verified digest.
func (c cache) storeSignature(digest string, sig *Signature) {
	dir := c.entry(digest)
	if dir == "" || sig == nil {
		return
	}
	if data, err := json.Marshal(sig); err == nil {
		_ = writeAtomic(filepath.Join(dir, "signature.json"), data)
	}
}

// tagFile returns the file recording what location's tag last named.
func (c cache) tagFile(location string) string {
	sum := sha256.Sum256([]byte(location))
	return filepath.Join(c.dir, "tags", hex.EncodeToString(sum[:]))
}

// storeTag records that location's tag named digest.
func (c cache) storeTag(location, digest string) {
	if c.dir == "" || os.MkdirAll(filepath.Join(c.dir, "tags"), 0o755) != nil {
		return
	}
	_ = writeAtomic(c.tagFile(location), []byte(digest+"\n"))
}

// loadTag returns the digest location's tag last named.
func (c cache) loadTag(location string) (string, bool) {
	if c.dir == "" {
		return "", false
	}
	data, err := os.ReadFile(c.tagFile(location))
	digest := strings.TrimSpace(string(data))
	return digest, err == nil && c.entry(digest) != ""
}

// writeAtomic writes data to path through a temporary file and a rename,
// so that a reader never sees part of it.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}
