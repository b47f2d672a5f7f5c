// Package tlstest makes the TLS files tests of a fleet on TLS need: a CA
// of its own and a server certificate it signed for the loopback
// addresses, generated with crypto/x509 at test time so that no private
// key is checked in.
package tlstest

import (
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
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// Files are the PEM files Generate wrote.
type Files struct {
	// CA is the CA's certificate: what clients verify against.
	CA string
	// Cert and Key are the server's certificate (valid for 127.0.0.1, ::1
	// and localhost) and its key.
	Cert, Key string
}

// Server is the `http.tls` section of a listener serving with f's
// certificate and of its clients verifying f's CA.
func (f Files) Server() httpconf.TLS {
	return httpconf.TLS{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA}
}

// Client is the `http.tls` section of a client verifying f's CA.
func (f Files) Client() httpconf.TLS { return httpconf.TLS{CAFile: f.CA} }

// New generates a CA and a server certificate into a temporary directory
// of tb's.
func New(tb testing.TB) Files {
	tb.Helper()
	f, err := Generate(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// Generate writes ca.pem, cert.pem and key.pem into dir: a new CA and a
// server certificate it signed.
func Generate(dir string) (Files, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gymfleet test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Files{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Files{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "gymfleet test server"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return Files{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	for _, w := range []struct {
		path, typ string
		der       []byte
		mode      os.FileMode
	}{
		{f.CA, "CERTIFICATE", caDER, 0o644},
		{f.Cert, "CERTIFICATE", der, 0o644},
		{f.Key, "PRIVATE KEY", keyDER, 0o600},
	} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), w.mode); err != nil {
			return Files{}, fmt.Errorf("tlstest: %w", err)
		}
	}
	return f, nil
}
