// Package initprogram is the program that runs inside the leases of a
// localsandbox server (sandboxd, the devserver): each lease's init, pid 1
// of its namespaces, and the supervisor of each managed process. Build it
// into a binary of its own, cmd/sandboxflow-init, which is all of it:
//
//	package main
//
//	import "github.com/sandboxflow/sandboxflow/localsandbox/initprogram"
//
//	func main() { initprogram.Main() }
//
// and put it beside the server's binary (make build does), or name it in
// localsandbox.Options.InitProgram or $SANDBOXD_INIT_PROGRAM.
//
// Why a program of its own: every lease and every managed process starts
// one. A server without it re-executes its own binary instead, which
// works the same but loads the whole server — the Temporal server and its
// package inits, in the devserver — for each command (docs/PERFORMANCE.md,
// P6, has the measurements).
package initprogram

import (
	"fmt"
	"os"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// Main is the program's main. A server starts the program with argv[0]
// set to the init's marker, and then the lease init or the supervisor
// takes over before main runs; Main itself runs only when someone starts
// the program by hand, and says what it is for.
func Main() {
	fmt.Fprintf(os.Stderr, "%s runs inside the sandboxes of a sandboxd server, which starts it; it does nothing by hand (protocol %s)\n",
		leaseinit.Program, leaseinit.ProtocolVersion)
	os.Exit(2)
}
