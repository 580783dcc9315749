package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/weirproxy/weir/backends"
	"github.com/weirproxy/weir/hooks"
	"github.com/weirproxy/weir/sdk/plan"
)

// errDiverged is what weir verify fails with when the kernel does not do
// what the plan says.
var errDiverged = errors.New("the kernel's rules diverge from the plan")

func verifyFlags(fs *pflag.FlagSet) {
	loadFlags(fs)
	fs.StringP("output", "o", "text", "output format: text or json")
}

// verifyResult is what weir verify found: the JSON form of its report.
type verifyResult struct {
	Mode         string `json:"mode"`
	Services     int    `json:"services"`
	Destinations int    `json:"destinations"`
	// Kept are the services a closed-policy plugin failed for: the kernel
	// keeps their last rules, which no fresh plan can know, so their
	// destinations are not compared.
	Kept []string `json:"kept,omitempty"`
	// KeptDestinations are destinations the kernel serves for no planned
	// service while there are kept services: possibly a kept service's
	// rules from before its last change. Not compared.
	KeptDestinations []string           `json:"keptDestinations,omitempty"`
	Divergences      []verifyDivergence `json:"divergences"`
}

// verifyDivergence is one backends.Divergence in JSON.
type verifyDivergence struct {
	Service     string `json:"service,omitempty"`
	Destination string `json:"destination,omitempty"`
	Field       string `json:"field"`
	Want        string `json:"want,omitempty"`
	Got         string `json:"got"`
	Message     string `json:"message"`
}

// runVerify computes the plan as weir plan does, reads the configured
// mode's rules back from the kernel and reports every difference. It never
// writes to the kernel.
func runVerify(env *environment) error {
	output, _ := env.flags.GetString("output")
	if output != "text" && output != "json" {
		return fmt.Errorf("%w: --output %q: use text or json", errUsage, output)
	}
	ctx, cancel := signalContext()
	defer cancel()
	load, cancelLoad, err := loading(ctx, env)
	if err != nil {
		return err
	}
	defer cancelLoad()
	res, err := verify(ctx, load, env)
	if err != nil {
		return err
	}
	if err := writeVerify(env.stdout, output, res); err != nil {
		return err
	}
	if n := len(res.Divergences); n > 0 {
		return fmt.Errorf("%w: %d divergences", errDiverged, n)
	}
	return nil
}

// verify builds the backend (only to read the kernel through it), computes
// the final plan, loading the source and the plugins within load, and
// compares the two.
func verify(ctx, load context.Context, env *environment) (*verifyResult, error) {
	reader, closeReader, err := newReader(env)
	if err != nil {
		return nil, err
	}
	defer closeReader()
	chain, err := newChain(load, env, hooks.Options{})
	if err != nil {
		return nil, err
	}
	defer closeChain(chain)
	// Without a backend the proxy plans only; it cannot adopt the kernel's
	// rules for a failing closed plugin, so those services show as kept.
	p, err := loadedProxy(load, env, nil, chain)
	if err != nil {
		return nil, err
	}
	if err := p.Sync(ctx, true); err != nil {
		return nil, err
	}
	final, kept := keptServices(p.Planned(), p.Plan())
	want, owners := reader.Expected(final)
	got, err := reader.ReadBack(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the %s rules back: %w", env.cfg.Mode, err)
	}
	keptView, _ := reader.Expected(kept)
	divs, skipped := leaveKeptOut(backends.Compare(want, owners, got), kept, keptView)
	res := &verifyResult{Mode: env.cfg.Mode, Services: len(final.Services), Destinations: len(want.Destinations),
		Divergences: make([]verifyDivergence, 0, len(divs))}
	for _, k := range kept.Keys() {
		res.Kept = append(res.Kept, k.String())
	}
	for _, d := range skipped {
		res.KeptDestinations = append(res.KeptDestinations, d.Destination.String())
	}
	for _, d := range divs {
		res.Divergences = append(res.Divergences, jsonDivergence(d))
	}
	return res, nil
}

// newReader builds the configured mode's backend, only to read the kernel
// through it; closeReader releases it.
func newReader(env *environment) (reader backends.Reader, closeReader func(), err error) {
	be, err := newBackend(env)
	if err != nil {
		return nil, nil, err
	}
	reader, ok := be.(backends.Reader)
	if !ok {
		be.Close()
		return nil, nil, fmt.Errorf("mode %s: this backend cannot read its rules back from the kernel", env.cfg.Mode)
	}
	return reader, func() { be.Close() }, nil
}

// leaveKeptOut splits the divergences into those that count and those of
// the kept services: divergences at their planned destinations, and, while
// there are kept services, destinations the kernel serves for no planned
// service. The kernel keeps a kept service's rules from before the change
// the closed plugin failed on (an old port, node port or load-balancer
// IP), which no fresh plan knows, so those cannot be told apart.
func leaveKeptOut(divs []backends.Divergence, kept *plan.Plan, keptView *backends.View) (count, skipped []backends.Divergence) {
	if len(kept.Services) == 0 {
		return divs, nil
	}
	for _, d := range divs {
		_, planned := keptView.Destinations[d.Destination]
		switch {
		case d.Field == "anomaly":
			count = append(count, d)
		case planned:
		case d.Field == "destination" && d.Service == (plan.Key{}):
			skipped = append(skipped, d)
		default:
			count = append(count, d)
		}
	}
	return count, skipped
}

// keptServices splits the planner's services into the final plan and the
// services a closed-policy plugin failed for (in planned, not in final).
func keptServices(planned, final *plan.Plan) (*plan.Plan, *plan.Plan) {
	kept := &plan.Plan{Node: final.Node, Services: map[plan.Key]*plan.Service{}}
	for k, s := range planned.Services {
		if _, ok := final.Services[k]; !ok {
			kept.Services[k] = s
		}
	}
	return final, kept
}

func jsonDivergence(d backends.Divergence) verifyDivergence {
	j := verifyDivergence{Field: d.Field, Want: d.Want, Got: d.Got, Message: d.String()}
	if d.Service != (plan.Key{}) {
		j.Service = d.Service.String()
	}
	if d.Destination != (backends.Destination{}) {
		j.Destination = d.Destination.String()
	}
	return j
}

// writeVerify prints the result in format text or json.
func writeVerify(w io.Writer, format string, res *verifyResult) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	for _, d := range res.Divergences {
		if _, err := fmt.Fprintln(w, d.Message); err != nil {
			return err
		}
	}
	for _, k := range res.Kept {
		if _, err := fmt.Fprintf(w, "not compared: %s (a closed-policy plugin failed for it; the kernel keeps its last rules)\n", k); err != nil {
			return err
		}
	}
	for _, d := range res.KeptDestinations {
		if _, err := fmt.Fprintf(w, "not compared: %s, served for no planned service (possibly a kept service's rules from before its last change)\n", d); err != nil {
			return err
		}
	}
	verdict := "the kernel matches the plan"
	if n := len(res.Divergences); n > 0 {
		verdict = fmt.Sprintf("%d %s between the plan and the kernel", n, plural(n, "divergence", "divergences"))
	}
	_, err := fmt.Fprintf(w, "%s: %d %s, %d %s: %s\n", res.Mode, res.Services, plural(res.Services, "service", "services"),
		res.Destinations, plural(res.Destinations, "destination", "destinations"), verdict)
	return err
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
