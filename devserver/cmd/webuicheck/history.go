package main

import (
	"bytes"
	"context"
	"fmt"

	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
)

// storedHistory returns the run's event history as the server stores it,
// every event in its protobuf wire form, read by a client of its own that
// has no codec: payloads come back exactly as they were written, encoded
// or not.
func storedHistory(ctx context.Context, s *stack.Stack, run compensatedRun) ([]byte, error) {
	c, err := client.DialContext(ctx, client.Options{
		HostPort:  s.Temporal.FrontendHostPort(),
		Namespace: s.Temporal.Namespace(),
	})
	if err != nil {
		return nil, fmt.Errorf("connect a codec-less client: %w", err)
	}
	defer c.Close()
	var history []byte
	events := c.GetWorkflowHistory(ctx, run.workflowID, run.runID, false, 0)
	for events.HasNext() {
		event, err := events.Next()
		if err != nil {
			return nil, fmt.Errorf("read the history of %s: %w", run.workflowID, err)
		}
		wire, err := proto.Marshal(event)
		if err != nil {
			return nil, fmt.Errorf("marshal event %d: %w", event.GetEventId(), err)
		}
		history = append(history, wire...)
	}
	return history, nil
}

// checkStoredHistory checks whether the marker's word, in the run's input
// and output, is readable in the stored history: it must not be when
// payloads are encrypted, and must be when they are not (which shows the
// search would find it).
func checkStoredHistory(ctx context.Context, s *stack.Stack, run compensatedRun, m marker, encrypted bool) error {
	history, err := storedHistory(ctx, s, run)
	if err != nil {
		return err
	}
	plain := bytes.Contains(history, []byte(m.word))
	switch {
	case encrypted && plain:
		return fmt.Errorf("payloads are encrypted, yet the stored history of %s holds %q in plain text", run.workflowID, m.word)
	case !encrypted && !plain:
		return fmt.Errorf("the stored history of %s does not hold %q although payloads are not encrypted: the history check is broken", run.workflowID, m.word)
	}
	return nil
}
