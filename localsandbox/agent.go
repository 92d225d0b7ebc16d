package localsandbox

import (
	"net/http"
	"strings"
	"unicode/utf8"
)

// The self API (docs/CREATEOS-API.md §3.15): code running inside a lease
// pauses or deletes its own lease, without a key, as the SDKs' selfPause
// and selfDelete do:
//
//	(in the lease) curl -X POST 'http://127.0.0.1:1029/self/delete?reason=done'   → 202
//
// The listener is the server's, inside the lease's network namespace
// (network.AgentAddr, internal/network/agent.go), and the handler is bound
// to its lease when the namespace is made: a request on it acts on that
// lease and no other, whatever it carries. A lease without a namespace of
// the server's (process-group isolation, or a server that is not root)
// has no agent: the port is closed there, as it is outside any sandbox.
//
// Both answer 202 before they act, and the answer is written to the
// caller's socket before the act begins: a pause freezes the caller (its
// 202 waits in its socket and is read when the lease resumes), a delete
// kills it. One request at a time per lease (the next: 429); no body.

// maxSelfReason is how much of ?reason= is kept, as the hosted service
// keeps it.
const maxSelfReason = 128

// selfAPI is the handler of l's self API.
func (s *Server) selfAPI(l *lease) http.Handler {
	busy := make(chan struct{}, 1)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case busy <- struct{}{}:
			defer func() { <-busy }()
		default:
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusTooManyRequests, "a self request of this sandbox is being served")
			return
		}
		action, found := strings.CutPrefix(r.URL.Path, "/self/")
		select {
		case <-s.done: // the server destroys every lease, this one too
			writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
			return
		default:
		}
		switch {
		case !found || action != "pause" && action != "delete":
			writeError(w, http.StatusNotFound, "no such self route: POST /self/pause or /self/delete")
			return
		case r.Method != http.MethodPost:
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, "the self API takes POST")
			return
		case r.ContentLength != 0:
			writeError(w, http.StatusRequestEntityTooLarge, "the self API takes no body")
			return
		}
		act := func() {
			if err := s.destroySandbox(l); err != nil {
				s.log.Warn("a sandbox's own delete failed", "sandbox", l.id, "err", err)
			}
		}
		if action == "pause" {
			if act = s.selfPause(l); act == nil {
				writeError(w, http.StatusConflict, "the sandbox is "+l.status())
				return
			}
		}
		s.log.Info("sandbox signal from inside", "sandbox", l.id, "action", action,
			"reason", selfReason(r.URL.Query().Get("reason")))
		writeJSON(w, http.StatusAccepted, "success", map[string]string{"id": l.id})
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		s.workers.Go(act)
	})
}

// selfPause moves l to pausing and returns the pause to run once the
// answer is written; nil when l is neither running nor already pausing.
func (s *Server) selfPause(l *lease) func() {
	state, ok := l.transition([]string{stateRunning}, statePausing)
	switch {
	case ok:
		return l.pause
	case state == statePausing:
		return func() {} // under way
	}
	return nil
}

// selfReason is the reason's first maxSelfReason characters.
func selfReason(reason string) string {
	if utf8.RuneCountInString(reason) <= maxSelfReason {
		return reason
	}
	return string([]rune(reason)[:maxSelfReason])
}
