//go:build race

package hooks

// raceEnabled is true under the race detector, which slows the host side.
const raceEnabled = true
