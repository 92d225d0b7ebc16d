package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const root = "../.."

// The checked-in schema is what the Go types generate: a field added,
// renamed or documented anew without `go generate ./workflows` fails here.
func TestCheckedInSchemaIsGeneratedFromTheTypes(t *testing.T) {
	want, err := Generate(root)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(root, OutPath))
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run `go generate ./workflows` and commit it", OutPath)
	}
}

// Each message is there, by the name the guide uses, and says what the
// encoder writes: a result's fields without omitempty are required, an
// input's never are; durations in inputs may be strings.
func TestSchemaSaysWhatTheJSONIs(t *testing.T) {
	out, err := Generate(root)
	require.NoError(t, err)
	var schema struct {
		Defs map[string]struct {
			Ref        string                     `json:"$ref"`
			Required   []string                   `json:"required"`
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"$defs"`
	}
	require.NoError(t, json.Unmarshal(out, &schema))
	for _, m := range messages {
		def, ok := schema.Defs[m.name]
		require.True(t, ok, m.name)
		assert.Contains(t, schema.Defs, def.Ref[len("#/$defs/"):], m.name)
	}
	result := schema.Defs["workflows.Result"]
	assert.ElementsMatch(t, []string{"exitCode", "leaseId", "freshLeases"}, result.Required)
	assert.Contains(t, result.Properties, "stdout", "sandbox.Result's fields are inlined, as encoding/json does")
	assert.Empty(t, schema.Defs["workflows.Request"].Required)
	assert.Empty(t, schema.Defs["sandbox.Command"].Required, "inside an input")
	assert.Subset(t, schema.Defs["sandbox.FailureDetails"].Required, []string{"kind", "retryable"},
		"a result, though a session's carried state holds it too")
	prop := func(def, name string) string {
		var b bytes.Buffer
		require.NoError(t, json.Compact(&b, schema.Defs[def].Properties[name]), "%s.%s", def, name)
		return b.String()
	}
	assert.Contains(t, prop("sandbox.Command", "timeout"), `"type":"string"`)
	assert.Contains(t, prop("sandbox.Command", "stdin"), `"contentEncoding":"base64"`)
	assert.Contains(t, prop("sandbox.FailureDetails", "field"), "JSON path")
}
