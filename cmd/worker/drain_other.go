//go:build !unix

package main

import "os"

// drainSignal is nil where there is no SIGUSR1: such a worker drains only
// when told through Temporal, never by a signal.
var drainSignal os.Signal
