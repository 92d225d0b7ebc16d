package main

import (
	"net/http"
	"time"

	"github.com/sandboxflow/sandboxflow/faultproxy"
)

// A faultKind is one way the network or the sandbox server fails a kind of
// request.
type faultKind struct {
	name   string
	method string
	path   string // a FaultProxy path pattern
	fault  faultproxy.Fault
}

// faultKinds lists every fault the soak injects, by the requests it breaks.
// stall must outlast the worker's operation timeout.
func faultKinds(stall time.Duration) []faultKind {
	unavailable := faultproxy.Status(http.StatusServiceUnavailable)
	limited := faultproxy.Status(http.StatusTooManyRequests)
	const (
		sandboxes = "/sandboxes"
		sandbox   = "/sandboxes/*"
		processes = "/sandboxes/*/processes"
		process   = "/sandboxes/*/processes/*"
		connect   = "/sandboxes/*/processes/*/connect"
	)
	return []faultKind{
		{"lost sandbox create response", http.MethodPost, sandboxes, faultproxy.DropResponse()},
		{"sandbox create 503", http.MethodPost, sandboxes, unavailable},
		{"sandbox create 429", http.MethodPost, sandboxes, limited},

		{"lost process create response", http.MethodPost, processes, faultproxy.DropResponse()},
		{"process create timeout", http.MethodPost, processes, faultproxy.Stall(stall)},
		{"process create 502", http.MethodPost, processes, faultproxy.Status(http.StatusBadGateway)},
		{"process create 429", http.MethodPost, processes, limited},

		{"connect 503", http.MethodGet, connect, unavailable},
		{"connect 429", http.MethodGet, connect, limited},
		{"stream cut", http.MethodGet, connect, faultproxy.CutStream(2, 0)},
		{"sequence gap", http.MethodGet, connect, faultproxy.SequenceGap(2)},
		{"sequence rewound", http.MethodGet, connect, faultproxy.RewindSequence(2)},
		{"duplicate frames", http.MethodGet, connect, faultproxy.DuplicateFrames()},

		{"process kill 503", http.MethodDelete, process, unavailable},

		{"exec 503", http.MethodPost, sandbox + "/exec", unavailable},
		{"exec 429", http.MethodPost, sandbox + "/exec", limited},
		{"file upload 503", http.MethodPut, sandbox + "/files", unavailable},
		{"file upload 429", http.MethodPut, sandbox + "/files", limited},
		{"file upload stored, then 500", http.MethodPut, sandbox + "/files", faultproxy.FailAfterForward(http.StatusInternalServerError, nil)},
		{"lost file upload response", http.MethodPut, sandbox + "/files", faultproxy.DropResponse()},
		{"gate write 503", http.MethodPost, process + "/input", unavailable},
		{"gate write 429", http.MethodPost, process + "/input", limited},
		{"gate write delivered, then 500", http.MethodPost, process + "/input", faultproxy.FailAfterForward(http.StatusInternalServerError, nil)},
		{"lost gate write response", http.MethodPost, process + "/input", faultproxy.DropResponse()},
		{"sandbox destroy 503", http.MethodDelete, sandbox, unavailable},
		{"sandbox destroy 429", http.MethodDelete, sandbox, limited},
		{"sandbox list 429", http.MethodGet, sandboxes, limited},
	}
}

// addFaults adds one rule per fault kind. A request of a class is broken
// with probability rate in all, spread evenly over the class's kinds
// (rules are tried in turn, so the k-th of n kinds gets rate/(n-(k-1)·rate)
// of the requests that reach it).
func addFaults(proxy *faultproxy.Proxy, kinds []faultKind, rate float64) {
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
		proxy.AddRule(faultproxy.Rule{
			Name:        k.name,
			Method:      k.method,
			Path:        k.path,
			Probability: min(share/(1-before*share), 1),
			Fault:       k.fault,
		})
	}
}
