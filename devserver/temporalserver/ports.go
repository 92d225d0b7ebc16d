package temporalserver

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
)

// PortInUseError reports that a port Start was asked to use is taken,
// typically by another Temporal server (`temporal server start-dev`, an
// earlier `make dev` still running).
type PortInUseError struct {
	Service string // "frontend" or "UI"
	Addr    string // host:port
	Port    int
	Err     error // from net.Listen
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("temporalserver: %s: port %d is in use (%s)", e.Service, e.Port, e.Addr)
}

func (e *PortInUseError) Unwrap() error { return e.Err }

// listen binds ip:port; port 0 lets the kernel pick a free one.
func listen(service, ip string, port int) (net.Listener, error) {
	addr := net.JoinHostPort(ip, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, &PortInUseError{Service: service, Addr: addr, Port: port, Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("temporalserver: %s: listen on %s: %w", service, addr, err)
	}
	return ln, nil
}

// reservePort returns a port the Temporal server can bind on ip: port itself
// if it is free, a free one if port is 0. The Temporal server binds its
// listeners itself, some only after other services have started, so the
// port must stay free in between without a listener holding it.
//
// The port is left in TIME_WAIT (we connect to it and close the accepted
// end first): for the next minute Linux then neither hands it out to
// bind(:0) nor picks it as the local port of an outgoing connection, while
// an explicit bind, with SO_REUSEADDR as Go sets it, still succeeds.
// Without this, a port released by its probe was, now and then, taken by
// one of the server's own outgoing connections before the service bound it.
func reservePort(service, ip string, port int) (int, error) {
	ln, err := listen(service, ip, port)
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	port = ln.Addr().(*net.TCPAddr).Port
	if err := enterTimeWait(ln); err != nil {
		return 0, fmt.Errorf("temporalserver: %s: reserve port %d: %w", service, port, err)
	}
	return port, nil
}

func enterTimeWait(ln net.Listener) error {
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		return err
	}
	return server.Close() // the side that closes first enters TIME_WAIT
}
