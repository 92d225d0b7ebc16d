//go:build unix

package main

import (
	"os"
	"syscall"
)

// drainSignal asks a host-mode worker to drain: SIGUSR1.
var drainSignal os.Signal = syscall.SIGUSR1
