package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certValidity is how long every certificate of a test's PKI is valid: far
// longer than any test, short enough never to matter outside one.
const certValidity = 24 * time.Hour

// pki is a test control plane's certificate authority and keys, generated in
// Go for each control plane; nothing of it outlives the test.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	serial int64
}

// Paths of the PKI's files inside its folder.
const (
	caCertFile    = "ca.crt"
	servingCert   = "apiserver.crt"
	servingKey    = "apiserver.key"
	saKeyFile     = "sa.key"
	saPubFile     = "sa.pub"
	kcmCertFile   = "controller-manager.crt"
	kcmKeyFile    = "controller-manager.key"
	adminCertFile = "admin.crt"
	adminKeyFile  = "admin.key"
	adminUser     = "weir-e2e-admin"
	kcmUser       = "system:kube-controller-manager"
	mastersGroup  = "system:masters"
)

// newPKI writes into dir a CA, kube-apiserver's serving certificate for the
// loopback addresses and the in-cluster names, the service-account signing
// key pair, and client certificates for the admin (in system:masters) and
// the controller manager.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "weir-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, ca: ca, caKey: key, serial: 1,
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	if err := os.WriteFile(p.path(caCertFile), p.caPEM, 0o600); err != nil {
		return nil, err
	}
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback,
			net.IPv4(10, 96, 0, 1), net.ParseIP("fd00:10:96::1")},
	}
	if err := p.issueFiles(serving, servingCert, servingKey); err != nil {
		return nil, err
	}
	for _, c := range []struct{ user, group, cert, key string }{
		{adminUser, mastersGroup, adminCertFile, adminKeyFile},
		{kcmUser, "", kcmCertFile, kcmKeyFile},
	} {
		var groups []string
		if c.group != "" {
			groups = []string{c.group}
		}
		if err := p.issueFiles(clientTemplate(c.user, groups), c.cert, c.key); err != nil {
			return nil, err
		}
	}
	return p, p.writeServiceAccountKeys()
}

// path is name inside the PKI's folder.
func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// clientTemplate is a client certificate's template for user in groups, as
// kube-apiserver's x509 authenticator reads them: CN the user, O the groups.
func clientTemplate(user string, groups []string) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

// issue signs tmpl with the CA for a fresh key and returns both in PEM.
func (p *pki) issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	p.serial++
	now := time.Now()
	tmpl.SerialNumber = big.NewInt(p.serial)
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(certValidity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, key.Public(), p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// issueFiles is issue writing the certificate and key to files of the PKI.
func (p *pki) issueFiles(tmpl *x509.Certificate, certName, keyName string) error {
	certPEM, keyPEM, err := p.issue(tmpl)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.path(certName), certPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.path(keyName), keyPEM, 0o600)
}

// writeServiceAccountKeys writes the key pair kube-apiserver signs and
// verifies service-account tokens with.
func (p *pki) writeServiceAccountKeys() error {
	key, err := newKey()
	if err != nil {
		return err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.path(saKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.path(saPubFile), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

// newKey is a fresh ECDSA P-256 key, which every part of the control plane
// accepts and which is far quicker to generate than RSA.
func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// encodeKey is key in PEM as an "EC PRIVATE KEY" block.
func encodeKey(key crypto.Signer) ([]byte, error) {
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("unexpected key type %T", key)
	}
	der, err := x509.MarshalECPrivateKey(ec)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}
