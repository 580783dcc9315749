package compare

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"

	"github.com/weirproxy/weir/test/netns"
)

// Counts is what a proxy left in its node namespace's kernel: nftables
// objects (iptables-nft's rules are nftables rules too) plus iptables-legacy's
// tables, chains and rules, IPv4 and IPv6 together. The namespace is fresh
// for each run, so everything in it is the proxy's.
type Counts struct {
	Tables, Chains, Rules int
	// Elements are the elements of every named set and map.
	Elements int
}

func (c *Counts) add(o Counts) {
	c.Tables += o.Tables
	c.Chains += o.Chains
	c.Rules += o.Rules
	c.Elements += o.Elements
}

// countKernel counts what is in ns's kernel with `nft -j list ruleset`
// and iptables-legacy-save, never on a timed path: at 10k services these
// listings take seconds.
func countKernel(ctx context.Context, ns *netns.Namespace) (Counts, error) {
	out, err := countNFT(ctx, ns)
	if err != nil {
		return out, err
	}
	for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue // no iptables-legacy on this host: nothing can be there
		}
		var buf bytes.Buffer
		cmd := ns.Command(ctx, tool)
		cmd.Stdout = &buf
		if err := cmd.Run(); err != nil {
			return out, fmt.Errorf("%s: %w", tool, err)
		}
		out.add(countSave(&buf))
	}
	return out, nil
}

// countNFT streams `nft -j list ruleset` from ns into counts.
func countNFT(ctx context.Context, ns *netns.Namespace) (Counts, error) {
	cmd := ns.Command(ctx, "nft", "-j", "list", "ruleset")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Counts{}, err
	}
	if err := cmd.Start(); err != nil {
		return Counts{}, fmt.Errorf("nft: %w", err)
	}
	c, perr := countJSON(bufio.NewReaderSize(stdout, 1<<20))
	_, _ = io.Copy(io.Discard, stdout) // let nft finish writing after a parse error
	if err := cmd.Wait(); err != nil {
		return c, fmt.Errorf("nft -j list ruleset: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return c, perr
}

// countJSON counts the objects of nft's JSON ruleset, one array item at a
// time: {"nftables": [{"table": ...}, {"chain": ...}, {"rule": ...},
// {"set": {"elem": [...]}}, {"map": ...}, ...]}.
func countJSON(r io.Reader) (Counts, error) {
	var c Counts
	dec := json.NewDecoder(r)
	for _, want := range []any{json.Delim('{'), "nftables", json.Delim('[')} {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) && want == json.Delim('{') {
			return c, nil // nothing printed: an empty ruleset
		}
		if err != nil {
			return c, fmt.Errorf("nft JSON: want %v: %w", want, err)
		}
		if tok != want {
			return c, fmt.Errorf("nft JSON: want %v, got %v", want, tok)
		}
	}
	for dec.More() {
		var item map[string]json.RawMessage
		if err := dec.Decode(&item); err != nil {
			return c, fmt.Errorf("nft JSON: %w", err)
		}
		if err := c.countItem(item); err != nil {
			return c, err
		}
	}
	return c, nil
}

// countItem adds one item of nft's JSON ruleset.
func (c *Counts) countItem(item map[string]json.RawMessage) error {
	for kind, raw := range item {
		switch kind {
		case "table":
			c.Tables++
		case "chain":
			c.Chains++
		case "rule":
			c.Rules++
		case "set", "map":
			var s struct {
				Elem []json.RawMessage `json:"elem"`
			}
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("nft JSON %s: %w", kind, err)
			}
			c.Elements += len(s.Elem)
		}
	}
	return nil
}

// countSave counts an iptables-save listing: "*table", ":CHAIN policy"
// and "-A CHAIN rule" lines.
func countSave(r io.Reader) Counts {
	var c Counts
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "*"):
			c.Tables++
		case strings.HasPrefix(line, ":"):
			c.Chains++
		case strings.HasPrefix(line, "-A "):
			c.Rules++
		}
	}
	return c
}
