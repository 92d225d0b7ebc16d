package codec

import (
	"net/http"
	"net/url"
	"strings"

	"go.temporal.io/sdk/converter"
)

// MaxRequestBytes bounds a codec server request body. Temporal refuses
// payloads over 2 MiB by default; the UI sends a few at a time.
const MaxRequestBytes = 32 << 20

// Headers the Web UI sends with its codec requests.
var allowedHeaders = strings.Join([]string{"Content-Type", "X-Namespace"}, ", ")

// NewHTTPHandler returns a codec server for the ring k: the SDK's payload
// codec HTTP handler (POST …/encode and …/decode, bodies of JSON
// temporal.api.common.v1.Payloads) over NewPayloadCodec(k), behind CORS for
// the Web UI.
//
// The Web UI calls a codec server from the operator's browser, from the
// UI's own origin, so the browser asks first (a preflight OPTIONS request)
// whether that origin may POST here with the headers Content-Type and
// X-Namespace, and, when the UI is set to include credentials, with
// cookies. allowedOrigins are the origins allowed to, exactly as browsers
// send them ("http://127.0.0.1:8233": scheme, host, port, no path); there
// is no wildcard, since whoever may call a codec server may decrypt.
// A browser request from any other origin is refused with 403 before
// anything is decoded. Requests without an Origin header (other programs,
// tctl or the SDK's remote codec) are served.
//
// Serve it only where those who may read the payloads can reach it: on
// loopback, or behind the same authentication as the UI.
func NewHTTPHandler(k *Keys, allowedOrigins ...string) http.Handler {
	origins := make(map[string]bool, len(allowedOrigins))
	for _, o := range allowedOrigins {
		if o = normalizeOrigin(o); o != "" {
			origins[o] = true
		}
	}
	return &corsHandler{
		origins: origins,
		next:    http.MaxBytesHandler(converter.NewPayloadCodecHTTPHandler(NewPayloadCodec(k)), MaxRequestBytes),
	}
}

// corsHandler answers CORS preflights and refuses other origins' browser
// requests before passing the rest to next.
type corsHandler struct {
	origins map[string]bool
	next    http.Handler
}

func (h *corsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Add("Vary", "Origin")
	origin := r.Header.Get("Origin")
	if origin != "" {
		if !h.origins[normalizeOrigin(origin)] {
			http.Error(w, "codec server: this origin may not use it", http.StatusForbidden)
			return
		}
		w.Header().Set("Access-Control-Allow-Origin", origin)
		w.Header().Set("Access-Control-Allow-Credentials", "true")
	}
	if r.Method == http.MethodOptions {
		w.Header().Set("Allow", "POST, OPTIONS")
		if origin != "" {
			w.Header().Set("Access-Control-Allow-Methods", "POST, OPTIONS")
			w.Header().Set("Access-Control-Allow-Headers", allowedHeaders)
			w.Header().Set("Access-Control-Max-Age", "600")
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	h.next.ServeHTTP(w, r)
}

// normalizeOrigin returns the scheme://host[:port] of an origin in lower
// case, or "" when it is not one.
func normalizeOrigin(origin string) string {
	u, err := url.Parse(strings.TrimSpace(origin))
	if err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return ""
	}
	return strings.ToLower(u.Scheme + "://" + u.Host)
}
