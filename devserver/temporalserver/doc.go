// Package temporalserver runs a complete Temporal server inside the calling
// process: the frontend, history, matching and worker services of
// go.temporal.io/server, SQLite persistence (in memory, or in a file that
// survives restarts), and the Temporal Web UI. It is what `make dev`,
// `make run` and the end-to-end tests use instead of a `temporal` binary.
//
//	srv, err := temporalserver.Start(ctx, temporalserver.DefaultOptions())
//	...
//	c, err := client.Dial(client.Options{HostPort: srv.FrontendHostPort(), Namespace: srv.Namespace()})
//	...
//	fmt.Println("history:", srv.RunURL(run.GetID(), run.GetRunID()))
//	...
//	srv.Stop()
//
// When Start returns, the namespace exists and its search attributes can be
// upserted and queried: both are written to the database before the server
// starts, so no server cache has to catch up.
//
// Things to know:
//
//   - Start checks the frontend and UI ports before it touches anything and
//     reports a taken one as a *PortInUseError ("port 7233 is in use").
//     The internal services' ports are free ports picked at each start.
//   - The server's logs go to Options.Logger from Warn up. Warnings logged
//     while Stop runs are demoted to Debug: services that are still up warn
//     about those already stopped.
//   - Memory: a process that links the server has ~115 MB RSS before
//     anything starts, mostly pages of its 200 MB binary; a started, idle
//     server adds ~30 MB. Start takes ~0.1 s (~0.4 s the first time in a
//     process), Stop ~0.1-0.4 s.
//   - Every Start/Stop cycle leaves ~30 goroutines behind (gRPC client
//     connections the server never closes) and, in memory mode, the
//     database: the SQLite plugin keeps each database open until the
//     process exits. Harmless for tests that start a few servers; do not
//     start thousands in one process.
//   - A database file must be used by one server at a time.
package temporalserver
