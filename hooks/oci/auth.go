package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
)

// DockerConfig is a keychain reading registry credentials from a docker
// config file: a docker login's config.json, or the .dockerconfigjson of
// a Kubernetes Secret of type kubernetes.io/dockerconfigjson mounted as a
// file. Only its "auths" section is used; credential helpers are not run.
// The file is read at every lookup, so a rotated Secret is picked up.
type DockerConfig struct {
	// Path is the file's path.
	Path string
}

// dockerAuth is one entry of a docker config file's auths.
type dockerAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// Resolve returns the credentials the file holds for target's registry,
// or anonymous access when it holds none.
func (d DockerConfig) Resolve(target authn.Resource) (authn.Authenticator, error) {
	data, err := os.ReadFile(d.Path)
	if err != nil {
		return nil, fmt.Errorf("docker config: %w", err)
	}
	var file struct {
		Auths map[string]dockerAuth `json:"auths"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("docker config %s: %w", d.Path, err)
	}
	want := registryHost(target.RegistryStr())
	for key, a := range file.Auths {
		if registryHost(key) == want {
			return authn.FromConfig(authn.AuthConfig{Username: a.Username, Password: a.Password, Auth: a.Auth,
				IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}), nil
		}
	}
	return authn.Anonymous, nil
}

// registryHost reduces an auths key, which may be a URL such as
// https://index.docker.io/v1/, to the registry's host, with Docker Hub's
// names made one.
func registryHost(key string) string {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	key, _, _ = strings.Cut(key, "/")
	switch key {
	case "docker.io", "registry-1.docker.io":
		return "index.docker.io"
	}
	return key
}
