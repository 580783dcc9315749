package oci

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// signatureType is the type every simple-signing payload of cosign names.
const signatureType = "cosign container image signature"

// Signature is one cosign signature: the simple-signing payload and the
// base64 ASN.1 ECDSA signature of its SHA-256.
type Signature struct {
	// Payload is the simple-signing JSON, as signed.
	Payload []byte `json:"payload"`
	// Signature is the base64 signature, as in the layer's annotation.
	Signature string `json:"signature"`
}

// payload is the simple-signing JSON cosign signs; its field order is
// cosign's, so that json.Marshal writes the same bytes.
type payload struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
	Optional map[string]any `json:"optional"`
}

// check verifies the signature with key and that the payload names digest.
func (s *Signature) check(key *ecdsa.PublicKey, digest string) error {
	raw, err := base64.StdEncoding.DecodeString(s.Signature)
	if err != nil {
		return fmt.Errorf("the %s annotation is not base64: %w", SignatureAnnotation, err)
	}
	sum := sha256.Sum256(s.Payload)
	if !ecdsa.VerifyASN1(key, sum[:], raw) {
		return errors.New("the signature does not verify with the configured public key")
	}
	var p payload
	if err := json.Unmarshal(s.Payload, &p); err != nil {
		return fmt.Errorf("the signed payload is not simple-signing JSON: %w", err)
	}
	if p.Critical.Type != signatureType {
		return fmt.Errorf("the signed payload's type is %q, not %q", p.Critical.Type, signatureType)
	}
	if got := p.Critical.Image.DockerManifestDigest; got != digest {
		return fmt.Errorf("the signed payload names manifest %s, not %s", got, digest)
	}
	return nil
}

// Sign signs the artifact of digest (sha256:HEX) in repository (such as
// ghcr.io/acme/plugin) as cosign sign does with a key.
func Sign(key *ecdsa.PrivateKey, repository, digest string) (*Signature, error) {
	var p payload
	p.Critical.Identity.DockerReference = repository
	p.Critical.Image.DockerManifestDigest = digest
	p.Critical.Type = signatureType
	data, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	raw, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	if err != nil {
		return nil, err
	}
	return &Signature{Payload: data, Signature: base64.StdEncoding.EncodeToString(raw)}, nil
}

// signatureTag returns the tag cosign stores the signatures of digest at.
func signatureTag(digest string) string {
	return strings.Replace(digest, ":", "-", 1) + ".sig"
}

// verify fetches the signatures of digest from r's repository and returns
// the first that the client's key verifies.
func (c *Client) verify(ctx context.Context, r Ref, digest string) (*Signature, error) {
	tag := signatureTag(digest)
	manifest, err := c.get(ctx, r.repo.Tag(tag))
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("%w: manifest %s has no signature (tag %s not found)", ErrUnsigned, digest, tag)
	}
	if err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	m, err := v1.ParseManifest(strings.NewReader(string(manifest)))
	if err != nil {
		return nil, fmt.Errorf("signature: tag %s: not an image manifest: %w", tag, err)
	}
	var why []string
	for _, layer := range m.Layers {
		if layer.MediaType != SimpleSigningMediaType {
			continue
		}
		data, err := c.blob(ctx, r.repo, layer, maxBlobSize)
		if err != nil {
			why = append(why, err.Error())
			continue
		}
		sig := &Signature{Payload: data, Signature: layer.Annotations[SignatureAnnotation]}
		if err := sig.check(c.PublicKey, digest); err != nil {
			why = append(why, err.Error())
			continue
		}
		return sig, nil
	}
	if len(why) == 0 {
		return nil, fmt.Errorf("%w: tag %s holds no %s layer", ErrUnsigned, tag, SimpleSigningMediaType)
	}
	return nil, fmt.Errorf("no valid signature of manifest %s at tag %s: %s", digest, tag, strings.Join(why, "; "))
}

// LoadPublicKey reads an ECDSA P-256 public key from a PEM file, such as
// the cosign.pub that cosign generate-key-pair writes.
func LoadPublicKey(path string) (*ecdsa.PublicKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key %s: %w", path, err)
	}
	pub, ok := key.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("public key %s: not an ECDSA P-256 key", path)
	}
	return pub, nil
}

// LoadPrivateKey reads an unencrypted ECDSA P-256 private key from a PEM
// file, PKCS#8 ("PRIVATE KEY") or SEC1 ("EC PRIVATE KEY").
func LoadPrivateKey(path string) (*ecdsa.PrivateKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	var key any
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("private key %s: PEM block %q is not an unencrypted PKCS#8 or SEC1 key "+
			"(a cosign.key is encrypted; convert it, for example with openssl)", path, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("private key %s: %w", path, err)
	}
	priv, ok := key.(*ecdsa.PrivateKey)
	if !ok || priv.Curve != elliptic.P256() {
		return nil, fmt.Errorf("private key %s: not an ECDSA P-256 key", path)
	}
	return priv, nil
}

// readPEM reads the first PEM block of a file.
func readPEM(path string) (*pem.Block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	return block, nil
}
