package oci

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// titleAnnotation names a layer's file, as oras and other tools do.
const titleAnnotation = "org.opencontainers.image.title"

// rawManifest is a manifest ready to put, with its media type.
type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// Push uploads wasm as a plugin artifact at r, which must name a tag, and
// returns its manifest digest. With key set it also pushes a cosign
// signature of it, replacing any signatures already at its signature tag.
// title is the file name recorded on the layer.
func (c *Client) Push(ctx context.Context, r Ref, wasm []byte, title string, key *ecdsa.PrivateKey) (string, error) {
	if r.Pinned() {
		return "", fmt.Errorf("%s names a digest; push to a tag, such as %s%s:v1", r, Scheme, r.Repository())
	}
	config := []byte("{}")
	manifest, err := c.putManifest(ctx, r, r.tag, ArtifactType,
		static.NewLayer(config, ConfigMediaType), static.NewLayer(wasm, WasmMediaType),
		map[string]string{titleAnnotation: title})
	if err != nil {
		return "", err
	}
	digest := digestOf(manifest)
	if key == nil {
		return digest, nil
	}
	sig, err := Sign(key, r.Repository(), digest)
	if err != nil {
		return "", fmt.Errorf("sign %s: %w", digest, err)
	}
	if err := c.PushSignature(ctx, r, digest, sig); err != nil {
		return "", err
	}
	return digest, nil
}

// PushSignature puts sig at the signature tag of digest in r's
// repository, as cosign does: an image manifest whose one layer is the
// payload, annotated with the signature. It replaces the signatures
// already there.
func (c *Client) PushSignature(ctx context.Context, r Ref, digest string, sig *Signature) error {
	payload := static.NewLayer(sig.Payload, SimpleSigningMediaType)
	diffID, err := payload.Digest()
	if err != nil {
		return err
	}
	cfg, err := json.Marshal(v1.ConfigFile{
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{diffID}},
	})
	if err != nil {
		return err
	}
	_, err = c.putManifest(ctx, r, signatureTag(digest), "",
		static.NewLayer(cfg, types.OCIConfigJSON), payload, map[string]string{SignatureAnnotation: sig.Signature})
	if err != nil {
		return fmt.Errorf("signature: %w", err)
	}
	return nil
}

// putManifest uploads config and layer and puts, at tag, an image manifest
// of them with the layer annotated, returning the manifest as put.
func (c *Client) putManifest(ctx context.Context, r Ref, tag, artifactType string, config, layer v1.Layer,
	annotations map[string]string) ([]byte, error) {
	opts := c.options(ctx)
	configDesc, err1 := describe(config, nil)
	layerDesc, err2 := describe(layer, annotations)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	for _, l := range []v1.Layer{config, layer} {
		if err := remote.WriteLayer(r.repo, l, opts...); err != nil {
			return nil, fmt.Errorf("upload blob to %s: %w", r.Repository(), err)
		}
	}
	manifest, err := json.Marshal(v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1,
		ArtifactType: artifactType, Config: configDesc, Layers: []v1.Descriptor{layerDesc}})
	if err != nil {
		return nil, err
	}
	if err := remote.Put(r.repo.Tag(tag), rawManifest(manifest), opts...); err != nil {
		return nil, fmt.Errorf("put manifest at %s:%s: %w", r.Repository(), tag, err)
	}
	return manifest, nil
}

// describe returns the descriptor of a static layer.
func describe(l v1.Layer, annotations map[string]string) (v1.Descriptor, error) {
	digest, err := l.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	size, err := l.Size()
	if err != nil {
		return v1.Descriptor{}, err
	}
	mt, err := l.MediaType()
	if err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: mt, Size: size, Digest: digest, Annotations: annotations}, nil
}
