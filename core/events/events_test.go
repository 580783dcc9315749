package events

import (
	"strings"
	"testing"

	"k8s.io/client-go/tools/record"
)

// drain returns the events recorded so far.
func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestSyncFailuresPostOnceAndRecover(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	r := NewReporter(rec, "node-a")
	r.CommitFailed()
	r.CommitFailed()
	r.Committed() // two failures: below the threshold, nothing to say
	if got := drain(rec); len(got) != 0 {
		t.Fatalf("events after two failures: %q", got)
	}
	for range FailuresBeforeEvent + 2 {
		r.CommitFailed()
	}
	r.Committed()
	got := drain(rec)
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning SyncFailing 3 syncs in a row") ||
		!strings.HasPrefix(got[1], "Normal SyncRecovered Rules committed again after 5 failed syncs") {
		t.Errorf("events %q", got)
	}
}

func TestPluginQuarantineEvents(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	r := NewReporter(rec, "node-a")
	r.PluginQuarantined("canary", true)
	r.PluginQuarantined("canary", false)
	got := drain(rec)
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning PluginQuarantined Hook plugin canary is quarantined") ||
		!strings.HasPrefix(got[1], "Normal PluginReleased Hook plugin canary") {
		t.Errorf("events %q", got)
	}
}
