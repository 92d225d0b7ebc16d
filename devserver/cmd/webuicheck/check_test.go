package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestMarkerOutputIsNotInTheCommand(t *testing.T) {
	m := newMarker()
	command := strings.Join(m.command, " ")
	if strings.Contains(command, m.output) {
		t.Fatalf("command %q contains its output %q: the page could show it from the input alone", command, m.output)
	}
	if !strings.Contains(command, m.word) || !strings.HasPrefix(m.output, m.word) {
		t.Fatalf("word %q must be in both the command %q and the output %q", m.word, command, m.output)
	}
	if other := newMarker(); other.word == m.word {
		t.Fatalf("two markers share the word %q", m.word)
	}
}

func TestMissingFrom(t *testing.T) {
	dom := `<div>webuicheck-compensated</div><span>sandboxflow.CreateLease</span>`
	got := missingFrom(dom, []string{"webuicheck-compensated", "sandboxflow.AcquireFreshLease"})
	if len(got) != 1 || got[0] != "sandboxflow.AcquireFreshLease" {
		t.Fatalf("missingFrom = %q, want only the activity that is not there", got)
	}
}

func TestLastErrorSkipsHarmlessLines(t *testing.T) {
	log := "/usr/bin/chromium: 9: [: 25276059648: unexpected operator\n" +
		"[1:2:ERROR:net] connection refused\n" +
		"[1:3:ERROR:dbus/bus.cc:405] Failed to connect to the bus\n\n"
	if got, want := lastError(log), ": [1:2:ERROR:net] connection refused"; got != want {
		t.Fatalf("lastError = %q, want %q", got, want)
	}
	if got := lastError("[1:3:ERROR:dbus/bus.cc:405] Failed to connect to the bus"); got != "" {
		t.Fatalf("lastError of D-Bus noise only = %q, want nothing", got)
	}
}

func TestOneLine(t *testing.T) {
	err := errors.Join(errors.New("first"), fmt.Errorf("run failed: %w", context.DeadlineExceeded))
	if got, want := oneLine(err, time.Minute), "first; run failed: context deadline exceeded (the check gave up after -timeout 1m0s)"; got != want {
		t.Fatalf("oneLine = %q, want %q", got, want)
	}
}
