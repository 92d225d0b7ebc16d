package codec

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/encoding/protojson"
)

const uiOrigin = "http://127.0.0.1:8233"

func startCodecServer(t *testing.T, k *Keys) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(NewHTTPHandler(k, uiOrigin+"/"))
	t.Cleanup(srv.Close)
	return srv
}

// post sends payloads to the codec server as the Web UI does.
func post(t *testing.T, url, origin string, ps ...*commonpb.Payload) (*http.Response, []*commonpb.Payload) {
	t.Helper()
	body, err := protojson.Marshal(&commonpb.Payloads{Payloads: ps})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Namespace", "default")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		return resp, nil
	}
	var out commonpb.Payloads
	require.NoError(t, protojson.Unmarshal(data, &out), "%s", data)
	return resp, out.GetPayloads()
}

func TestHTTPHandlerEncodesAndDecodes(t *testing.T) {
	k := mustKeys(t, "k1")
	srv := startCodecServer(t, k)

	resp, enc := post(t, srv.URL+"/encode", uiOrigin, plainPayload("over http"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, enc, 1)
	assert.Equal(t, Encoding, string(enc[0].GetMetadata()[converter.MetadataEncoding]))
	assert.Equal(t, uiOrigin, resp.Header.Get("Access-Control-Allow-Origin"))
	assert.Equal(t, "true", resp.Header.Get("Access-Control-Allow-Credentials"))

	// What the server encrypted, the SDK's codec decrypts, and back.
	var s string
	dec, err := NewPayloadCodec(k).Decode(enc)
	require.NoError(t, err)
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(dec[0], &s))
	assert.Equal(t, "over http", s)

	resp, dec = post(t, srv.URL+"/decode?preserveStorageRefs=true", uiOrigin, enc...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(dec[0], &s))
	assert.Equal(t, "over http", s)

	resp, _ = post(t, srv.URL+"/decode", "", enc...)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a program without an Origin header is served")
	assert.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))
}

func TestHTTPHandlerWorksAsTheSDKsRemoteCodec(t *testing.T) {
	k := mustKeys(t, "k1")
	srv := startCodecServer(t, k)
	remote := converter.NewRemotePayloadCodec(converter.RemotePayloadCodecOptions{Endpoint: srv.URL})
	enc, err := remote.Encode(payloads(plainPayload("remote")))
	require.NoError(t, err)
	dec, err := NewPayloadCodec(k).Decode(enc)
	require.NoError(t, err)
	var s string
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(dec[0], &s))
	assert.Equal(t, "remote", s)
}

func TestHTTPHandlerAnswersThePreflightOfTheUIOnly(t *testing.T) {
	srv := startCodecServer(t, mustKeys(t, "k1"))
	preflight := func(origin string) *http.Response {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodOptions, srv.URL+"/decode", nil)
		require.NoError(t, err)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "content-type,x-namespace")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}

	resp := preflight(uiOrigin)
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, uiOrigin, resp.Header.Get("Access-Control-Allow-Origin"))
	assert.Contains(t, resp.Header.Get("Access-Control-Allow-Methods"), "POST")
	assert.Equal(t, "Content-Type, X-Namespace", resp.Header.Get("Access-Control-Allow-Headers"))
	assert.Equal(t, "true", resp.Header.Get("Access-Control-Allow-Credentials"))
	assert.Contains(t, resp.Header.Values("Vary"), "Origin")

	for _, origin := range []string{"http://evil.example", "http://127.0.0.1:8234", "https://127.0.0.1:8233", "null"} {
		resp := preflight(origin)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, origin)
		assert.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"), origin)
	}
}

func TestHTTPHandlerRefusesOtherOriginsBeforeDecoding(t *testing.T) {
	k := mustKeys(t, "k1")
	srv := startCodecServer(t, k)
	enc, err := NewPayloadCodec(k).Encode(payloads(plainPayload("not for evil.example")))
	require.NoError(t, err)
	resp, dec := post(t, srv.URL+"/decode", "http://evil.example", enc...)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Nil(t, dec)
	assert.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))
}

func TestHTTPHandlerReportsAnUnknownKeyAsABadRequest(t *testing.T) {
	enc, err := NewPayloadCodec(mustKeys(t, "other")).Encode(payloads(plainPayload("x")))
	require.NoError(t, err)
	srv := startCodecServer(t, mustKeys(t, "k1"))
	body, err := protojson.Marshal(&commonpb.Payloads{Payloads: enc})
	require.NoError(t, err)
	resp, err := http.Post(srv.URL+"/decode", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(msg), `"other"`)
}
