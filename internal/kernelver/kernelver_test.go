package kernelver

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for release, ok := range map[string]bool{
		"6.1.0-28-cloud-amd64": true,
		"6.18.2":               true,
		"7.0":                  true,
		"6.0.19":               false,
		"5.15.0-91-generic":    false,
		"4.19.0":               false,
		"6.1-rc1":              true,
	} {
		if err := check(release); (err == nil) != ok {
			t.Errorf("check(%q) = %v, want supported %v", release, err, ok)
		} else if err != nil && !strings.Contains(err.Error(), release) {
			t.Errorf("check(%q) = %v: does not name the release", release, err)
		}
	}
	if err := check("linux"); err == nil {
		t.Error("check(\"linux\") accepted a release without a version")
	}
}

func TestRunningKernelHasARelease(t *testing.T) {
	r, err := Release()
	if err != nil || r == "" {
		t.Fatalf("Release() = %q, %v", r, err)
	}
	if _, ok := majorMinor(r); !ok {
		t.Errorf("cannot read the version of the running kernel %q", r)
	}
}
