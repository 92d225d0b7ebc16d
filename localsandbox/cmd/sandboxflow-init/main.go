// Command sandboxflow-init runs inside the sandboxes of sandboxd and of
// the devserver's embedded sandbox server: each lease's init and the
// supervisor of each managed process (package localsandbox/initprogram).
// The server finds it beside its own binary:
//
//	go build -o bin/ ./cmd/sandboxd ./cmd/sandboxflow-init   # make build
//
// Without it a server re-executes its own, larger binary for each lease
// and each managed process.
package main

import "github.com/sandboxflow/sandboxflow/localsandbox/initprogram"

func main() { initprogram.Main() }
