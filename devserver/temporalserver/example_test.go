package temporalserver_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"

	enumspb "go.temporal.io/api/enums/v1"

	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
)

// A development server's main: start, print where things are, serve until
// Ctrl-C.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	opts := temporalserver.DefaultOptions() // 127.0.0.1:7233, UI on :8233, in memory
	opts.DBFile = "temporal.db"             // keep workflows across restarts
	opts.SearchAttributes = map[string]enumspb.IndexedValueType{
		"SandboxLeaseID": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	}
	srv, err := temporalserver.Start(ctx, opts)
	if err != nil {
		log.Fatal(err) // e.g. "temporalserver: frontend: port 7233 is in use (127.0.0.1:7233)"
	}
	fmt.Printf("Temporal frontend: %s (namespace %q)\nWeb UI: %s\n", srv.FrontendHostPort(), srv.Namespace(), srv.UIURL())

	<-ctx.Done()
	if err := srv.Stop(); err != nil {
		log.Fatal(err)
	}
}
