package localsandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

// benchSender sends MiB mebibytes to host:port and waits for the sink's
// one-byte acknowledgement that it read them all; host "self" starts a sink
// on the lease's own loopback first.
const benchSender = `
import socket, sys, threading
host, port, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if host == "self":
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    host, port = "127.0.0.1", srv.getsockname()[1]
    def sink():
        c, _ = srv.accept()
        while c.recv(1 << 20):
            pass
        c.sendall(b"k"); c.close()
    threading.Thread(target=sink, daemon=True).start()
buf = b"\0" * (1 << 20)
s = socket.create_connection((host, port))
for _ in range(mib):
    s.sendall(buf)
s.shutdown(socket.SHUT_WR)
assert s.recv(1) == b"k"
`

// BenchmarkEgressThroughput measures bulk TCP from a lease (python3, 64 MiB
// a run): through slirp4netns to a sink on the host (the egress path), and
// to a sink on the lease's own loopback (the baseline). MB/s includes one
// exec's overhead per 64 MiB.
func BenchmarkEgressThroughput(b *testing.B) {
	testenv.RequireRoot(b, "lease networks need a server running as root")
	testenv.RequireCommand(b, "slirp4netns")
	srv, err := New(Options{InsecureNoAuth: true, Root: filepath.Join(b.TempDir(), "root"), Egress: EgressAny, EgressHostLoopback: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	b.Cleanup(func() {
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	set, _ := srv.compileEgress(context.Background(), nil)
	sh, _ := lookupShape("")
	l, err := srv.createLease(leaseSpec{shape: sh, labels: map[string]string{}, net: netSpec{egress: set}})
	if err != nil {
		b.Fatal(err)
	}
	req, _ := http.NewRequest("PUT", hs.URL+"/v1/sandboxes/"+l.id+"/files?path=/workspace/send.py", strings.NewReader(benchSender))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("upload: %v", err)
	} else {
		resp.Body.Close()
	}
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Write([]byte("k"))
				c.Close()
			}()
		}
	}()
	const mib = 64
	run := func(b *testing.B, host string, port int) {
		b.SetBytes(mib << 20)
		for range b.N {
			body, _ := json.Marshal(map[string]any{"cmd": "python3", "args": []string{"/workspace/send.py", host, fmt.Sprint(port), fmt.Sprint(mib)}})
			resp, err := http.Post(hs.URL+"/v1/sandboxes/"+l.id+"/exec", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			var out struct {
				Data struct{ Result execResult } `json:"data"`
			}
			json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if out.Data.Result.ExitCode != 0 {
				b.Fatalf("sender: %d %s", out.Data.Result.ExitCode, strings.TrimSpace(out.Data.Result.Stderr))
			}
		}
	}
	b.Run("slirp4netns", func(b *testing.B) { run(b, "10.0.2.2", sink.Addr().(*net.TCPAddr).Port) })
	b.Run("lease-loopback", func(b *testing.B) { run(b, "self", 0) })
}
