package nftables

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/weirproxy/weir/internal/nsenter"
)

// nftLists checks that the nft tool lists what the backend committed: `nft
// list ruleset`, its JSON form and its terse form each succeed in the
// backend's namespace. An operator's first look at a node is one of them;
// nft 1.0.6 aborted on a rule whose lookup key held another lookup's result
// and on concatenations of its sizeless integer type. It skips outside CI
// when the nft tool is missing.
func nftLists(t testing.TB, b *Backend) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs the nft tool to list the tables (CI=true: must run)")
		}
		t.Skip("needs the nft tool to list the tables")
	}
	for _, args := range [][]string{{"list", "ruleset"}, {"-j", "list", "ruleset"}, {"-t", "list", "ruleset"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var stderr strings.Builder
		var out []byte
		// A child forked on a thread inside the namespace starts there.
		err := nsenter.Do(b.opts.NetNS, func() (err error) {
			cmd := exec.CommandContext(ctx, "nft", args...)
			cmd.Stderr = &stderr
			out, err = cmd.Output()
			return err
		})
		cancel()
		switch {
		case err != nil:
			t.Errorf("nft %s fails after a sync: %v\n%s", strings.Join(args, " "), err, stderr.String())
		case args[0] == "-j" && !json.Valid(out):
			t.Errorf("nft -j list ruleset prints no valid JSON after a sync:\n%.2000s", out)
		case !strings.Contains(string(out), "weir"):
			t.Errorf("nft %s does not show Weir's tables after a sync:\n%.2000s", strings.Join(args, " "), out)
		}
	}
}
