package main

import (
	"net/http"
	"time"

	"github.com/sandboxflow/sandboxflow/testsuite"
)

// A faultKind is one way the network or the sandbox server fails a kind of
// request.
type faultKind struct {
	name   string
	method string
	path   string // a FaultProxy path pattern
	fault  testsuite.Fault
}

// faultKinds lists every fault the soak injects, by the requests it breaks.
// stall must outlast the worker's operation timeout.
func faultKinds(stall time.Duration) []faultKind {
	unavailable := testsuite.Status(http.StatusServiceUnavailable)
	limited := testsuite.Status(http.StatusTooManyRequests)
	const (
		sandboxes = "/sandboxes"
		sandbox   = "/sandboxes/*"
		processes = "/sandboxes/*/processes"
		process   = "/sandboxes/*/processes/*"
		connect   = "/sandboxes/*/processes/*/connect"
	)
	return []faultKind{
		{"lost sandbox create response", http.MethodPost, sandboxes, testsuite.DropResponse()},
		{"sandbox create 503", http.MethodPost, sandboxes, unavailable},
		{"sandbox create 429", http.MethodPost, sandboxes, limited},

		{"lost process create response", http.MethodPost, processes, testsuite.DropResponse()},
		{"process create timeout", http.MethodPost, processes, testsuite.Stall(stall)},
		{"process create 502", http.MethodPost, processes, testsuite.Status(http.StatusBadGateway)},
		{"process create 429", http.MethodPost, processes, limited},

		{"connect 503", http.MethodGet, connect, unavailable},
		{"connect 429", http.MethodGet, connect, limited},
		{"stream cut", http.MethodGet, connect, testsuite.CutStream(2, 0)},
		{"sequence gap", http.MethodGet, connect, testsuite.SequenceGap(2)},
		{"sequence rewound", http.MethodGet, connect, testsuite.RewindSequence(2)},
		{"duplicate frames", http.MethodGet, connect, testsuite.DuplicateFrames()},

		{"process kill 503", http.MethodDelete, process, unavailable},

		{"exec 503", http.MethodPost, sandbox + "/exec", unavailable},
		{"exec 429", http.MethodPost, sandbox + "/exec", limited},
		{"file upload 503", http.MethodPut, sandbox + "/files", unavailable},
		{"file upload 429", http.MethodPut, sandbox + "/files", limited},
		{"file upload stored, then 500", http.MethodPut, sandbox + "/files", testsuite.FailAfterForward(http.StatusInternalServerError, nil)},
		{"lost file upload response", http.MethodPut, sandbox + "/files", testsuite.DropResponse()},
		{"gate write 503", http.MethodPost, process + "/input", unavailable},
		{"gate write 429", http.MethodPost, process + "/input", limited},
		{"gate write delivered, then 500", http.MethodPost, process + "/input", testsuite.FailAfterForward(http.StatusInternalServerError, nil)},
		{"lost gate write response", http.MethodPost, process + "/input", testsuite.DropResponse()},
		{"sandbox destroy 503", http.MethodDelete, sandbox, unavailable},
		{"sandbox destroy 429", http.MethodDelete, sandbox, limited},
		{"sandbox list 429", http.MethodGet, sandboxes, limited},
	}
}

// addFaults adds one rule per fault kind. A request of a class is broken
// with probability rate in all, spread evenly over the class's kinds
// (rules are tried in turn, so the k-th of n kinds gets rate/(n-(k-1)·rate)
// of the requests that reach it).
func addFaults(proxy *testsuite.FaultProxy, kinds []faultKind, rate float64) {
	if rate <= 0 {
		return
	}
	perClass := map[string]int{}
	for _, k := range kinds {
		perClass[k.method+" "+k.path]++
	}
	seen := map[string]int{}
	for _, k := range kinds {
		class := k.method + " " + k.path
		n, before := float64(perClass[class]), float64(seen[class])
		seen[class]++
		share := rate / n
		proxy.AddRule(testsuite.Rule{
			Name:        k.name,
			Method:      k.method,
			Path:        k.path,
			Probability: min(share/(1-before*share), 1),
			Fault:       k.fault,
		})
	}
}
