package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
)

// codecPath is where settleProxy serves the codec server, on its own
// origin.
const codecPath = "/sandboxflow-codec"

// settleProxy serves the Web UI to Chromium for the pages of a run that
// is still running, which would otherwise never settle to be dumped.
//
// Chromium's virtual time (see renderBudget) stands still while a request
// is in flight, and the page of a running workflow always has one: it
// follows the run's history with long polls (waitNewEvent=true) that the
// server holds open until a new event or its own timeout. The proxy turns
// those long polls into plain reads of the history, which the page then
// repeats after a pause of its own, a timer over which virtual time runs.
// Nothing else changes: the pending activities and their heartbeat details
// come from the same requests, unchanged.
//
// A page served from the proxy's origin may not call the codec server
// (its CORS rules name the Web UI's origin), so the proxy also serves the
// codec server under codecPath, the way a deployment puts both behind one
// origin, and rewrites the endpoint in the UI's settings to point there.
type settleProxy struct {
	ui, codec *url.URL
	ln        net.Listener
	srv       *http.Server
}

// newSettleProxy serves the Web UI at uiURL, and the codec server at
// codecURL (if any), on a free loopback port.
func newSettleProxy(uiURL, codecURL string) (*settleProxy, error) {
	p := &settleProxy{}
	var err error
	if p.ui, err = url.Parse(uiURL); err != nil {
		return nil, fmt.Errorf("Web UI URL: %w", err)
	}
	if codecURL != "" {
		if p.codec, err = url.Parse(codecURL); err != nil {
			return nil, fmt.Errorf("codec URL: %w", err)
		}
	}
	if p.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("settle proxy: %w", err)
	}
	p.srv = &http.Server{Handler: p.handler()}
	go p.srv.Serve(p.ln)
	return p, nil
}

// URL is the proxy's base URL.
func (p *settleProxy) URL() string { return "http://" + p.ln.Addr().String() }

// page returns the proxy's URL of a Web UI page.
func (p *settleProxy) page(uiPage string) string {
	return p.URL() + strings.TrimPrefix(uiPage, p.ui.String())
}

func (p *settleProxy) Close() error { return p.srv.Close() }

func (p *settleProxy) handler() http.Handler {
	ui := httputil.NewSingleHostReverseProxy(p.ui)
	direct := ui.Director
	ui.Director = func(r *http.Request) {
		direct(r)
		if q := r.URL.Query(); q.Get("waitNewEvent") == "true" {
			q.Set("waitNewEvent", "false")
			r.URL.RawQuery = q.Encode()
		}
		if p.codec != nil && r.URL.Path == "/api/v1/settings" {
			r.Header.Del("Accept-Encoding") // read it plain, to rewrite it
		}
	}
	ui.ModifyResponse = func(resp *http.Response) error {
		if p.codec == nil || resp.Request.URL.Path != "/api/v1/settings" || resp.StatusCode != http.StatusOK {
			return nil
		}
		return p.pointCodecHere(resp)
	}
	mux := http.NewServeMux()
	mux.Handle("/", ui)
	if p.codec != nil {
		codec := httputil.NewSingleHostReverseProxy(p.codec)
		direct := codec.Director
		codec.Director = func(r *http.Request) {
			r.URL.Path, r.URL.RawPath = strings.TrimPrefix(r.URL.Path, codecPath), ""
			direct(r)
			// Same-origin for the browser; for the codec server, a request
			// from a program like any other.
			r.Header.Del("Origin")
		}
		mux.Handle(codecPath+"/", codec)
	}
	return mux
}

// pointCodecHere rewrites the Web UI's settings so that the page calls the
// codec server through the proxy.
func (p *settleProxy) pointCodecHere(resp *http.Response) error {
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	var settings map[string]any
	if err := json.Unmarshal(body, &settings); err != nil {
		return fmt.Errorf("Web UI settings: %w", err)
	}
	codec, ok := settings["Codec"].(map[string]any)
	if !ok {
		return fmt.Errorf("the Web UI's settings name no codec server: %s", body)
	}
	codec["Endpoint"] = p.URL() + codecPath
	if body, err = json.Marshal(settings); err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}
