package createos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// A Client leases a sandbox, runs a command in it and gives the sandbox
// back. Here the server is a stand-in that answers just enough of the
// protocol for one command, whose output it makes up; against the hosted
// service or the project's local server, only BaseURL and APIKey change.
func Example() {
	server := httptest.NewServer(standInServer())
	defer server.Close()

	client, err := createos.New(createos.Config{BaseURL: server.URL, APIKey: "example-key"})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	lease, err := client.CreateLease(ctx, sandbox.LeaseSpec{Labels: map[string]string{"owner": "example"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.DestroyLease(ctx, lease.ID)

	res, err := client.Execute(ctx, lease, sandbox.Command{Argv: []string{"echo", "hello from the sandbox"}}, nil)
	if err != nil {
		// A *sandbox.CleanupError here would mean: destroy the lease, never
		// run anything in it again.
		log.Fatal(err)
	}
	fmt.Printf("exit %d: %s", res.ExitCode, res.Stdout)
	// Output: exit 0: hello from the sandbox
}

// standInServer answers the requests of one CreateLease, Execute and
// DestroyLease.
func standInServer() http.Handler {
	ok := func(data any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
		}
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/sandboxes", ok(map[string]any{"id": "sb-1", "status": "running"}))
	mux.Handle("POST /v1/sandboxes/sb-1/exec", ok(map[string]any{"result": map[string]any{"exit_code": 0}}))
	mux.Handle("POST /v1/sandboxes/sb-1/processes", ok(map[string]any{"process_id": "p-1"}))
	mux.Handle("POST /v1/sandboxes/sb-1/processes/p-1/input", ok(map[string]any{"input_seq": 1}))
	mux.HandleFunc("GET /v1/sandboxes/sb-1/processes/p-1/connect", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"type":"data","seq":1,"stream":"stdout","data_base64":"aGVsbG8gZnJvbSB0aGUgc2FuZGJveAo="}`+"\n")
		io.WriteString(w, `{"type":"exit","exit_code":0}`+"\n")
	})
	mux.Handle("DELETE /v1/sandboxes/sb-1", ok(map[string]any{}))
	return mux
}
