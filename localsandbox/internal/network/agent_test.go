package network

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

// The self API's listener, in a namespace of the test's own: headers past
// agentMaxHeader are refused, a connection that sends nothing is cut at
// agentTimeout's deadline, and close returns while a handler still runs
// (a lease's own delete closes its agent from the handler's answer on).
func TestAgentIsBounded(t *testing.T) {
	testenv.RequireRoot(t, "the agent's listener is made in a network namespace")
	ns := testNetns(t)
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	a, err := serveAgent(ns, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	if err != nil {
		t.Fatal(err)
	}
	dial := func() net.Conn {
		var c net.Conn
		if err := inNetns(ns, func() (err error) {
			c, err = net.Dial("tcp", AgentAddr.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	status := func(c net.Conn, req string) string {
		c.SetDeadline(time.Now().Add(2 * agentTimeout))
		if _, err := c.Write([]byte(req)); err != nil {
			return err.Error()
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err.Error()
		}
		return strings.TrimSpace(line)
	}

	c := dial()
	if got := status(c, "POST /self/pause HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 2*agentMaxHeader)+"\r\n\r\n"); got != "HTTP/1.1 431 Request Header Fields Too Large" {
		t.Errorf("headers past the cap: %q", got)
	}
	c.Close()

	// Nothing sent: the server closes the connection at its deadline.
	c = dial()
	c.SetReadDeadline(time.Now().Add(3 * agentTimeout))
	if _, err := c.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("a silent connection: %v, want closed by the agent", err)
	}
	c.Close()

	c = dial()
	defer c.Close()
	go c.Write([]byte("POST /hold HTTP/1.1\r\nHost: x\r\n\r\n"))
	<-entered
	closed := make(chan struct{})
	go func() { a.close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("close waits for a running handler")
	}
}
