package reliability

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
)

// The sandbox was created but its id never reached the worker, on a server
// that, like the hosted service, has neither labels nor an
// Idempotency-Key: the client finds the sandbox by the name it gave it,
// the run uses it, and nothing is left behind.
//
// The worker reaches the real sandbox server through a FaultProxy and a
// hostedLike adapter that drops both extensions and answers lists
// paginated, as docs/CREATEOS-API.md describes the hosted service.
func TestLostSandboxCreateResponseOnAHostedLikeServer(t *testing.T) {
	e := start(t, options{noWorker: true})
	hosted := newHostedLike(t, e.stack.SandboxURL)
	proxy, err := faultproxy.New(hosted.srv.URL, 1)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	w, err := workerapp.New(e.stack.Client, workerapp.Config{
		Sandbox:           createos.Config{BaseURL: proxy.URL(), APIKey: e.stack.SandboxAPIKey, OperationTimeout: 10 * time.Second},
		HeartbeatInterval: 500 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	proxy.AddRule(faultproxy.Rule{Name: "lost", Method: http.MethodPost, Path: sandboxesPath, Times: 1, Fault: faultproxy.DropResponse()})
	marker := newMarker()

	res, err := e.run(request(command(marker, "echo done")))
	require.NoError(t, err)
	assert.Equal(t, marker+"\ndone\n", res.Stdout)
	assert.Zero(t, res.FreshLeases)
	assert.Equal(t, []string{res.LeaseID}, res.DestroyedLeases)

	require.Equal(t, 1, proxy.Fired("lost"), "log: %v", proxy.Log())
	lost := proxy.Log()[0]
	require.Equal(t, http.StatusOK, lost.Status, "the server created the sandbox")
	var created struct{ Data struct{ ID, Name string } }
	require.NoError(t, json.Unmarshal(lost.Response, &created))
	assert.Equal(t, res.LeaseID, created.Data.ID, "the run used the sandbox whose answer was lost: found by name")
	assert.NotEmpty(t, created.Data.Name)
	assert.Equal(t, 1, hosted.created(), "one sandbox was created in all")

	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1)
}

// hostedLike serves the sandbox server's API the way the hosted service
// would: the create's labels and Idempotency-Key are dropped, names are
// unique (409 NAME_TAKEN) and reported, views carry no labels, and the
// sandbox list is paginated two at a time. Everything else passes through.
type hostedLike struct {
	srv      *httptest.Server
	upstream *url.URL
	proxy    *httputil.ReverseProxy

	mu      sync.Mutex
	names   map[string]string // name → sandbox id ("" while created)
	byID    map[string]string // sandbox id → name
	creates int               // creates forwarded that created a sandbox
}

func newHostedLike(t *testing.T, upstream string) *hostedLike {
	u, err := url.Parse(upstream)
	require.NoError(t, err)
	h := &hostedLike{upstream: u, names: map[string]string{}, byID: map[string]string{}}
	h.proxy = httputil.NewSingleHostReverseProxy(u)
	h.proxy.FlushInterval = -1 // streams pass line by line
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", h.create)
	mux.HandleFunc("GET /v1/sandboxes", h.list)
	mux.HandleFunc("GET /v1/sandboxes/{sb}", h.get)
	mux.Handle("/", h.proxy)
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hostedLike) created() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.creates
}

func (h *hostedLike) create(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if json.NewDecoder(r.Body).Decode(&body) != nil {
		jsendFail(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	name, _ := body["name"].(string)
	delete(body, "name")   // the adapter keeps the names, and takes one for good
	delete(body, "labels") // the hosted service has no labels
	h.mu.Lock()
	if name == "" {
		name = "sandbox-" + strconv.Itoa(len(h.names)+1)
	}
	if _, taken := h.names[name]; taken {
		h.mu.Unlock()
		jsendFail(w, http.StatusConflict, "NAME_TAKEN")
		return
	}
	h.names[name] = ""
	h.mu.Unlock()
	raw, _ := json.Marshal(body)
	rq, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, h.upstream.String()+"/v1/sandboxes", bytes.NewReader(raw))
	rq.Header.Set("Content-Type", "application/json")
	rq.Header.Set("X-Api-Key", r.Header.Get("X-Api-Key")) // no Idempotency-Key
	status, data, err := h.do(rq)
	if err != nil || status != http.StatusOK {
		h.mu.Lock()
		delete(h.names, name)
		h.mu.Unlock()
		h.answer(w, status, data, err)
		return
	}
	id, _ := data["id"].(string)
	h.mu.Lock()
	h.names[name], h.byID[id] = id, name
	h.creates++
	h.mu.Unlock()
	h.answer(w, status, h.view(data), nil)
}

func (h *hostedLike) get(w http.ResponseWriter, r *http.Request) {
	rq, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, h.upstream.String()+r.URL.Path, nil)
	rq.Header.Set("X-Api-Key", r.Header.Get("X-Api-Key"))
	status, data, err := h.do(rq)
	if err == nil && status == http.StatusOK {
		data = h.view(data)
	}
	h.answer(w, status, data, err)
}

func (h *hostedLike) list(w http.ResponseWriter, r *http.Request) {
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	offset, _ := strconv.Atoi(r.URL.Query().Get("offset"))
	limit = min(max(limit, 1), 2)
	// The label filter of the query is not passed on: the hosted service
	// has none.
	rq, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, h.upstream.String()+"/v1/sandboxes?limit=500", nil)
	rq.Header.Set("X-Api-Key", r.Header.Get("X-Api-Key"))
	status, data, err := h.do(rq)
	if err != nil || status != http.StatusOK {
		h.answer(w, status, data, err)
		return
	}
	all, _ := data["data"].([]any)
	items := []any{}
	for _, item := range all {
		if v, ok := item.(map[string]any); ok {
			items = append(items, h.view(v))
		}
	}
	page := []any{}
	if offset < len(items) {
		page = items[offset:min(offset+limit, len(items))]
	}
	h.answer(w, http.StatusOK, map[string]any{"data": page,
		"pagination": map[string]any{"total": len(items), "limit": limit, "offset": offset, "count": len(page)}}, nil)
}

// view turns sandboxd's view into a hosted one: no labels, and the name.
// The workspace extension stays: sandboxd's may be a host path.
func (h *hostedLike) view(data map[string]any) map[string]any {
	delete(data, "labels")
	id, _ := data["id"].(string)
	h.mu.Lock()
	if name := h.byID[id]; name != "" {
		data["name"] = name
	}
	h.mu.Unlock()
	return data
}

// do sends rq upstream and returns its status and the data of a success.
func (h *hostedLike) do(rq *http.Request) (int, map[string]any, error) {
	resp, err := http.DefaultClient.Do(rq)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	var env struct {
		Data map[string]any `json:"data"`
	}
	if resp.StatusCode == http.StatusOK && json.Unmarshal(body, &env) != nil {
		return http.StatusBadGateway, nil, nil
	}
	return resp.StatusCode, env.Data, nil
}

// answer writes a success with data, or a JSend failure for status.
func (h *hostedLike) answer(w http.ResponseWriter, status int, data map[string]any, err error) {
	switch {
	case err != nil:
		jsendFail(w, http.StatusBadGateway, "UPSTREAM")
	case status != http.StatusOK:
		jsendFail(w, status, "UPSTREAM_"+strconv.Itoa(status))
	default:
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
	}
}

func jsendFail(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if status >= 500 {
		json.NewEncoder(w).Encode(map[string]any{"status": "error", "message": http.StatusText(status), "code": status})
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"status": "fail", "data": map[string]any{"code": code, "message": http.StatusText(status)}})
}
