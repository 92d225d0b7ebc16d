package faultproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// upstream is a stand-in server: POST /v1/things counts creations,
// GET /v1/things/1/connect streams five data frames and an exit frame.
type upstream struct {
	*httptest.Server
	created atomic.Int32
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/things", func(w http.ResponseWriter, r *http.Request) {
		u.created.Add(1)
		fmt.Fprint(w, `{"status":"success","data":{"id":"t1"}}`)
	})
	mux.HandleFunc("GET /v1/things/1/connect", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := 1; i <= 5; i++ {
			fmt.Fprintf(w, `{"type":"data","seq":%d,"stream":"stdout","data_base64":"eA=="}`+"\n", i)
		}
		fmt.Fprint(w, `{"type":"exit","exit_code":0}`+"\n")
	})
	u.Server = httptest.NewServer(mux)
	t.Cleanup(u.Close)
	return u
}

func newProxy(t *testing.T, target string) *Proxy {
	p, err := New(target, 1)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func post(t *testing.T, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/things", strings.NewReader("{}"))
	require.NoError(t, err)
	return http.DefaultClient.Do(req)
}

// frames returns the lines of a stream and whether it ended cleanly.
func frames(t *testing.T, url string) ([]string, error) {
	t.Helper()
	resp, err := http.Get(url + "/v1/things/1/connect")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var lines []string
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
	}
	return lines, scanner.Err()
}

func TestUnmatchedRequestsPassUnchanged(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	p.AddRule(Rule{Method: http.MethodDelete, Fault: Status(503)})

	resp, err := post(t, p.URL())
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.JSONEq(t, `{"status":"success","data":{"id":"t1"}}`, string(body))
	lines, err := frames(t, p.URL())
	require.NoError(t, err)
	assert.Len(t, lines, 6)
	assert.Empty(t, p.Log())
}

func TestStreamHeadersPassBeforeTheFirstFrame(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select { // the first frame comes only once the client has the headers
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, `{"type":"exit","exit_code":0}`+"\n")
	}))
	t.Cleanup(up.Close)
	for name, rule := range map[string]*Rule{
		"unmatched":   nil,
		"transformed": {Path: "/things/*/connect", Fault: DuplicateFrames()},
	} {
		t.Run(name, func(t *testing.T) {
			p := newProxy(t, up.URL)
			if rule != nil {
				p.AddRule(*rule)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL()+"/v1/things/1/connect", nil)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err, "the headers arrive before the first frame")
			resp.Body.Close()
		})
	}
	close(release)
}

func TestStatusAnswersWithoutForwarding(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	p.AddRule(Rule{Name: "storm", Method: http.MethodPost, Path: "/things", Times: 2, Fault: Status(429)})

	for i, want := range []int{429, 429, 200} {
		resp, err := post(t, p.URL())
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "request %d", i+1)
	}
	assert.Equal(t, int32(1), up.created.Load(), "only the unbroken request reached the server")
	assert.Equal(t, 2, p.Fired("storm"))
	require.Len(t, p.Log(), 2)
	assert.Equal(t, "/things", p.Log()[0].Path)
}

func TestDropResponseActsThenResets(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	p.AddRule(Rule{Method: http.MethodPost, Path: "/things", Times: 1, Fault: DropResponse()})

	_, err := post(t, p.URL())
	require.Error(t, err, "the client sees a broken connection")
	assert.Equal(t, int32(1), up.created.Load(), "but the server acted")
}

func TestDropResponseRecordsWhatTheClientMissed(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	p.AddRule(Rule{Name: "lost", Method: http.MethodPost, Times: 1, Fault: DropResponse()})

	_, err := post(t, p.URL())
	require.Error(t, err)
	log := p.Log()
	require.Len(t, log, 1)
	assert.Equal(t, http.StatusOK, log[0].Status)
	assert.JSONEq(t, `{"status":"success","data":{"id":"t1"}}`, string(log[0].Response))
	assert.NotContains(t, log[0].String(), "t1", "the log line never shows a body")
}

func TestFailAfterForwardActsThenFails(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	held := 0
	p.AddRule(Rule{Name: "500", Method: http.MethodPost, Times: 1, Fault: FailAfterForward(500, func() {
		held = int(up.created.Load())
	})})

	resp, err := post(t, p.URL())
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 500, resp.StatusCode)
	assert.Empty(t, body, "the server's answer never reaches the client")
	assert.Equal(t, 1, held, "the server had acted when the hold ran")
	require.Len(t, p.Log(), 1)
	assert.Equal(t, http.StatusOK, p.Log()[0].Status, "what the server really answered")
}

func TestPassOnlyRecords(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	p.AddRule(Rule{Name: "seen", Path: "/things/*/connect", Fault: Pass()})

	lines, err := frames(t, p.URL())
	require.NoError(t, err)
	assert.Len(t, lines, 6, "the stream passes whole")
	resp, err := post(t, p.URL())
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 1, p.Fired("seen"), "only the matching request is counted")
	require.Len(t, p.Log(), 1)
	assert.Equal(t, http.StatusOK, p.Log()[0].Status)
}

func TestHoldWaitsThenPassesUnchanged(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	held := -1
	p.AddRule(Rule{Name: "held", Method: http.MethodPost, Times: 1, Fault: Hold(func() {
		held = int(up.created.Load())
	})})

	resp, err := post(t, p.URL())
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 0, held, "the hold ran before the server saw the request")
	assert.Equal(t, int32(1), up.created.Load())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"status":"success","data":{"id":"t1"}}`, string(body))
	assert.Equal(t, 1, p.Fired("held"))
}

func TestStallActsThenOutlastsTheClient(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	p.AddRule(Rule{Method: http.MethodPost, Times: 1, Fault: Stall(time.Minute)})

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL()+"/v1/things", strings.NewReader("{}"))
	_, err := http.DefaultClient.Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, int32(1), up.created.Load())
}

func TestAfterSkipsTheFirstMatches(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up.URL)
	p.AddRule(Rule{Method: http.MethodPost, After: 1, Times: 1, Fault: Status(502)})

	var codes []int
	for range 3 {
		resp, err := post(t, p.URL())
		require.NoError(t, err)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	assert.Equal(t, []int{200, 502, 200}, codes)
}

func TestProbabilityIsReproducible(t *testing.T) {
	up := newUpstream(t)
	run := func() []int {
		p := newProxy(t, up.URL)
		p.AddRule(Rule{Method: http.MethodPost, Probability: 0.5, Fault: Status(503)})
		var codes []int
		for range 20 {
			resp, err := post(t, p.URL())
			require.NoError(t, err)
			resp.Body.Close()
			codes = append(codes, resp.StatusCode)
		}
		return codes
	}
	first := run()
	assert.Equal(t, first, run(), "the same seed breaks the same requests")
	assert.Contains(t, first, 503)
	assert.Contains(t, first, 200)
}

func TestStreamFaults(t *testing.T) {
	up := newUpstream(t)
	for name, tc := range map[string]struct {
		fault   Fault
		check   func(t *testing.T, lines []string)
		cutting bool
	}{
		"cut after frames": {fault: CutStream(2, 0), cutting: true, check: func(t *testing.T, lines []string) {
			assert.Len(t, lines, 2)
		}},
		"cut mid frame": {fault: CutStream(0, 70), cutting: true, check: func(t *testing.T, lines []string) {
			require.Len(t, lines, 2)
			assert.Equal(t, 70, len(lines[0])+1+len(lines[1]), "70 bytes pass, the second frame cut short")
		}},
		"sequence gap": {fault: SequenceGap(3), check: func(t *testing.T, lines []string) {
			require.Len(t, lines, 5)
			assert.Contains(t, lines[1], `"seq":2`)
			assert.Contains(t, lines[2], `"seq":4`)
		}},
		"duplicates": {fault: DuplicateFrames(), check: func(t *testing.T, lines []string) {
			require.Len(t, lines, 11)
			assert.Equal(t, lines[0], lines[1])
		}},
		"rewound sequence": {fault: RewindSequence(3), check: func(t *testing.T, lines []string) {
			require.Len(t, lines, 6)
			assert.Contains(t, lines[1], `"seq":2`)
			assert.Contains(t, lines[2], `"seq":2`, "frame 3 goes back to seq 2")
			assert.Contains(t, lines[3], `"seq":4`)
		}},
		"corrupt base64": {fault: CorruptBase64(2), check: func(t *testing.T, lines []string) {
			require.Len(t, lines, 6)
			assert.Contains(t, lines[1], "!not*base64!")
			assert.Contains(t, lines[2], "eA==")
		}},
	} {
		t.Run(name, func(t *testing.T) {
			p := newProxy(t, up.URL)
			p.AddRule(Rule{Path: "/things/*/connect", Fault: tc.fault})
			lines, err := frames(t, p.URL())
			if tc.cutting {
				require.Error(t, err, "a cut stream does not end cleanly")
			} else {
				require.NoError(t, err)
			}
			tc.check(t, lines)
		})
	}
}
