package bench

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"

	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/grpc"
)

// Tally counts requests by kind: the Temporal RPCs of a client and the
// workers on it (Interceptor), or the requests of a sandbox client
// (Transport). Counts, unlike times, do not depend on the machine's load:
// they say what a run costs wherever it runs. The zero Tally is ready.
type Tally struct {
	mu     sync.Mutex
	counts map[string]int
}

// Snapshot returns the counts so far, by kind.
func (t *Tally) Snapshot() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.counts)
}

func (t *Tally) add(kind string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts = make(map[string]int)
	}
	t.counts[kind]++
}

// Interceptor counts each unary RPC by its method's name; a task queue
// poll only when it brought a task (an empty long poll costs nothing).
// Give it to client.Options.ConnectionOptions.DialOptions with
// grpc.WithChainUnaryInterceptor.
func (t *Tally) Interceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		name := path.Base(method)
		switch reply.(type) {
		case *workflowservice.PollWorkflowTaskQueueResponse, *workflowservice.PollActivityTaskQueueResponse:
		default:
			// When it is sent: a run's last answer may reach its waiting
			// client before its worker's request returns.
			t.add(name)
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(interface{ GetTaskToken() []byte }); ok && len(r.GetTaskToken()) > 0 {
			t.add(name)
		}
		return err
	}
}

// Transport counts each request through base by its route: the method
// and the path below /v1 with the ids left out ("POST
// /sandboxes/{id}/processes").
func (t *Tally) Transport(base http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		t.add(r.Method + " " + route(r.URL.Path))
		return base.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// route is a sandbox API path with the sandbox and process ids replaced.
func route(p string) string {
	parts := strings.Split(strings.TrimPrefix(p, "/v1"), "/")
	for i := 1; i < len(parts); i++ {
		if parts[i-1] == "sandboxes" || parts[i-1] == "processes" {
			parts[i] = "{id}"
		}
	}
	return strings.Join(parts, "/")
}

// tallied is what a Tally counted between two snapshots.
type tallied map[string]int

func since(before, after map[string]int) tallied {
	out := tallied{}
	for k, n := range after {
		if d := n - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (c tallied) total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// per renders the counts divided by runs, largest first: "Poll 4, Respond 3".
func (c tallied) per(runs int) string {
	kinds := slices.Collect(maps.Keys(c))
	slices.SortFunc(kinds, func(a, b string) int {
		if c[a] != c[b] {
			return c[b] - c[a]
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %g", k, float64(c[k])/float64(runs)))
	}
	return strings.Join(parts, ", ")
}
