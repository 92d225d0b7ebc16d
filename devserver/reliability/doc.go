// Package reliability is the end-to-end reliability matrix of sandboxflow:
// one test per failure the product claims to survive, each on the real
// parts — an embedded Temporal server, the local sandbox server, a real
// worker — with a faultproxy.Proxy between the worker's sandbox client
// and the sandbox server.
//
// Every test asserts four things: the workflow's typed outcome; how many
// times the command really ran, counted on the sandbox side (each command
// prints a unique marker first, and a process that never passed its start
// gate never prints it); that nothing leaked (no lease, no process on the
// server, no sandbox process alive on the machine); and that the fault
// really happened, so that no test passes vacuously.
//
// The package holds tests only; run it with
//
//	cd devserver && go test -race ./reliability/
package reliability
