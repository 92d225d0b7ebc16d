package localsandbox_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// A program or test starts a local sandbox server on a loopback port and
// talks to it with the project's client. Shutdown kills every process the
// server started and removes every workspace.
func Example() {
	dir, err := os.MkdirTemp("", "sandboxd-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	srv, err := localsandbox.New(localsandbox.Options{
		APIKey: "example-key",
		Root:   filepath.Join(dir, "root"),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())

	client, err := createos.New(createos.Config{BaseURL: "http://" + ln.Addr().String(), APIKey: "example-key"})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	lease, err := client.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.DestroyLease(ctx, lease.ID)

	res, err := client.Execute(ctx, lease, sandbox.Command{Argv: []string{"sh", "-c", "echo hello from $PWD as uid $(id -u), in a network of $(grep -c : /proc/net/dev) interface"}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	// Output:
	// hello from /workspace as uid 0, in a network of 1 interface
}
