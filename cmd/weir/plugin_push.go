package main

import (
	"context"
	"crypto/ecdsa"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/hooks/oci"
)

// pluginPushUsage says how weir plugin push is called.
const pluginPushUsage = "use weir plugin push FILE.wasm oci://REGISTRY/REPO:TAG [--sign-key KEY.pem] [--docker-config FILE]"

// runPluginPush runs "weir plugin push": it uploads a .wasm file as a
// plugin artifact, signed with --sign-key when given, and prints its
// digest and the location that pins it.
func runPluginPush(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("weir plugin push", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	signKey := fs.String("sign-key", "", "unencrypted PEM ECDSA P-256 private key (PKCS#8 or SEC1): also push a cosign-compatible signature")
	dockerConfig := fs.String("docker-config", defaultDockerConfig(),
		"docker config file with the registry's credentials (default $DOCKER_CONFIG/config.json or ~/.docker/config.json)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("%w: %s", errUsage, pluginPushUsage)
	}
	file, location := fs.Arg(0), fs.Arg(1)
	ref, err := oci.Parse(location)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	wasm, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var key *ecdsa.PrivateKey
	if *signKey != "" {
		if key, err = oci.LoadPrivateKey(*signKey); err != nil {
			return err
		}
	}
	client := &oci.Client{Keychain: keychain(*dockerConfig)}
	digest, err := client.Push(context.Background(), ref, wasm, filepath.Base(file), key)
	if err != nil {
		return fmt.Errorf("push %s to %s: %w", file, location, err)
	}
	fmt.Fprintf(stdout, "pushed %s\ndigest %s\npinned %s%s@%s\n", location, digest, oci.Scheme, ref.Repository(), digest)
	if key != nil {
		fmt.Fprintf(stdout, "signed %s\n", digest)
	}
	return nil
}

// defaultDockerConfig returns the docker config file docker login writes,
// "" when there is none.
func defaultDockerConfig() string {
	dir := os.Getenv("DOCKER_CONFIG")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".docker")
	}
	path := filepath.Join(dir, "config.json")
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	return path
}

// keychain returns the credentials of a docker config file; anonymous
// access when path is "".
func keychain(path string) authn.Keychain {
	if path == "" {
		return nil
	}
	return oci.DockerConfig{Path: path}
}
