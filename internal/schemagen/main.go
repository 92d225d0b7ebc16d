// Command schemagen writes docs/schema/sandboxflow.schema.json: the JSON
// Schema (draft 2020-12) of every input and result a caller in another
// language sends to or reads from sandboxflow's workflows, and of the
// details of its failures. It is generated from the Go types by reflection
// over their JSON tags, with each field's doc comment as its description,
// so that it says what encoding/json reads and writes; its test fails when
// a type changes and the file was not regenerated.
//
//	go generate ./workflows     # or: go run ./internal/schemagen
//
// A field whose tag has omitempty or omitzero may be absent; a result
// always carries the others (they are "required" in results, never in
// inputs: absent input fields take their defaults). Durations are integers
// of nanoseconds in results and may be Go duration strings ("10s") in
// inputs, except inside temporal.RetryPolicy, which the SDK decodes.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// OutPath is where the schema lives, from the repository's root.
const OutPath = "docs/schema/sandboxflow.schema.json"

// message is one input or result of the workflows, by the name a caller
// knows it by.
type message struct {
	name, description string
	value             any
	input             bool
}

// messages are the schema's roots: one fact, one table.
var messages = []message{
	{"RunCommandInput", "The input of the workflow " + workflows.WorkflowName + ".", workflows.Request{}, true},
	{"RunCommandResult", "The result of " + workflows.WorkflowName + ", and the answer of its Update " + workflows.UpdateResult + ".", workflows.Result{}, false},
	{"RunCommandState", "The answer of " + workflows.WorkflowName + "'s query " + workflows.StateQuery + ".", workflows.State{}, false},
	{"SessionInput", "The input of the workflow " + workflows.SessionWorkflowName + ".", workflows.SessionRequest{}, true},
	{"SessionExecuteInput", "The argument of the session's Update " + workflows.UpdateExecute + ".", workflows.SessionCommand{}, true},
	{"SessionExecuteResult", "The answer of the session's Update " + workflows.UpdateExecute + ".", workflows.SessionResult{}, false},
	{"SessionSetEgressInput", "The argument of the session's Update " + workflows.UpdateSetEgress + ".", workflows.SessionEgress{}, true},
	{"SessionState", "The answer of the session's query " + workflows.StateQuery + " and of its Updates " +
		workflows.UpdatePause + ", " + workflows.UpdateResume + " and " + workflows.UpdateSetEgress + ".", workflows.SessionState{}, false},
	{"SessionForkResult", "The answer of the session's Update " + workflows.UpdateFork + ".", workflows.SessionFork{}, false},
	{"SessionSnapshotInput", "The argument of the session's Update " + workflows.UpdateSnapshot + ".", workflows.SessionSnapshot{}, true},
	{"SessionSnapshotResult", "The answer of the session's Update " + workflows.UpdateSnapshot + ": the template, which a LeaseSpec's rootfs names.", sandbox.Template{}, false},
	{"SessionCloseResult", "The answer of the session's Update " + workflows.UpdateClose + ", and the session's result.", workflows.SessionSummary{}, false},
	{"FailureDetails", "The one details object of every failure sandboxflow raises (an ApplicationFailure whose type is its kind).", sandbox.FailureDetails{}, false},
}

// workerOnly are the input fields a caller never writes: the worker's own
// state, carried across continue-as-new. The types under them are results
// the worker wrote, so their fields are required as results' are.
var workerOnly = map[string]bool{"workflows.SessionRequest.Carried": true}

func main() {
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	out, err := Generate(*root)
	if err == nil {
		err = os.WriteFile(filepath.Join(*root, OutPath), out, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

// Generate returns the schema, reading doc comments from the sources under
// root.
func Generate(root string) ([]byte, error) {
	g := &generator{defs: map[string]any{}, inputs: map[reflect.Type]bool{}}
	var err error
	if g.docs, err = fieldDocs(root, "sandbox", "workflows"); err != nil {
		return nil, err
	}
	for _, m := range messages {
		if m.input {
			g.markInputs(reflect.TypeOf(m.value))
		}
	}
	for _, m := range messages {
		g.defs[m.name] = map[string]any{"description": m.description, "$ref": g.ref(reflect.TypeOf(m.value))}
	}
	schema := map[string]any{
		"$schema": "https://json-schema.org/draft/2020-12/schema",
		"$id":     "https://github.com/sandboxflow/sandboxflow/" + OutPath,
		"title":   "sandboxflow workflow inputs, results and failure details",
		"description": "Generated from the Go types by internal/schemagen (go generate ./workflows); docs/POLYGLOT.md explains them. " +
			"The messages are the $defs named without a package (RunCommandInput …); the others are the Go types they are made of.",
		"$defs": g.defs,
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	err = enc.Encode(schema)
	return buf.Bytes(), err
}

type generator struct {
	defs map[string]any
	// inputs are the struct types reachable from an input: none of their
	// fields is required.
	inputs map[reflect.Type]bool
	// docs are the doc comments of fields, by "pkg.Type.Field".
	docs map[string]string
}

var durationType = reflect.TypeFor[time.Duration]()

// defName names a struct type's definition as Go does:
// "workflows.Request", "temporal.RetryPolicy" (an alias of the SDK's
// internal type).
func defName(t reflect.Type) string {
	if t.PkgPath() == "go.temporal.io/sdk/internal" {
		return "temporal." + t.Name()
	}
	return t.String()
}

func (g *generator) markInputs(t reflect.Type) {
	t = deref(t)
	switch t.Kind() {
	case reflect.Slice, reflect.Map:
		g.markInputs(t.Elem())
	case reflect.Struct:
		if g.inputs[t] || t == reflect.TypeFor[time.Time]() {
			return
		}
		g.inputs[t] = true
		for _, f := range fields(t) {
			if !workerOnly[f.owner+"."+f.Name] {
				g.markInputs(f.Type)
			}
		}
	}
}

// ref defines struct type t (once) and returns the reference to it.
func (g *generator) ref(t reflect.Type) string {
	name := defName(t)
	if _, done := g.defs[name]; !done {
		g.defs[name] = nil // recursion stops here
		g.defs[name] = g.object(t)
	}
	return "#/$defs/" + name
}

// object is the schema of struct type t: its JSON fields, embedded
// structs' fields inlined as encoding/json does.
func (g *generator) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	var required []string
	for _, f := range fields(t) {
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		s := g.schema(f.Type, t.PkgPath())
		if doc := g.docs[f.owner+"."+f.Name]; doc != "" {
			s["description"] = doc
		}
		props[name] = s
		optional := strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")
		if !optional && !g.inputs[t] {
			required = append(required, name)
		}
	}
	o := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

// schema is the schema of a field of type t in a struct of package pkg.
func (g *generator) schema(t reflect.Type, pkg string) map[string]any {
	switch {
	case t == durationType && strings.HasPrefix(pkg, "github.com/sandboxflow/"):
		return map[string]any{"anyOf": []any{
			map[string]any{"type": "integer", "description": "nanoseconds"},
			map[string]any{"type": "string", "description": `a Go duration ("10s", "1m30s"); inputs only`},
		}}
	case t == durationType:
		return map[string]any{"type": "integer", "description": "nanoseconds"}
	case t == reflect.TypeFor[time.Time]():
		return map[string]any{"type": "string", "format": "date-time"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return g.schema(t.Elem(), pkg)
	case reflect.Struct:
		return map[string]any{"$ref": g.ref(t)}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "contentEncoding": "base64"}
		}
		// A nil slice without omitempty is null.
		return map[string]any{"type": []string{"array", "null"}, "items": g.schema(t.Elem(), pkg)}
	case reflect.Map:
		return map[string]any{"type": []string{"object", "null"}, "additionalProperties": g.schema(t.Elem(), pkg)}
	}
	panic(fmt.Sprintf("schemagen: no schema for %s", t))
}

// field is a JSON field of a struct, with the type that declares it.
type field struct {
	reflect.StructField
	owner string // "workflows.Request"
}

// fields are the fields encoding/json writes for struct type t, the fields
// of untagged embedded structs inlined.
func fields(t reflect.Type) []field {
	var out []field
	for _, f := range reflect.VisibleFields(t) {
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" || len(f.Index) > 1 && !visible(t, f.Index) {
			continue
		}
		if f.Anonymous && tag == "" && deref(f.Type).Kind() == reflect.Struct {
			continue // inlined: VisibleFields lists its fields
		}
		out = append(out, field{f, ownerOf(t, f.Index)})
	}
	return out
}

// visible reports whether the promoted field at index is inlined by
// encoding/json: each struct on its path is embedded without a tag.
func visible(t reflect.Type, index []int) bool {
	for _, i := range index[:len(index)-1] {
		f := deref(t).Field(i)
		if !f.Anonymous || f.Tag.Get("json") != "" || !f.IsExported() {
			return false
		}
		t = f.Type
	}
	return true
}

// ownerOf names the struct that declares the field at index of t.
func ownerOf(t reflect.Type, index []int) string {
	for _, i := range index[:len(index)-1] {
		t = deref(t).Field(i).Type
	}
	return deref(t).String()
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// fieldDocs reads the doc comments of the struct fields declared in the
// packages in dirs under root, by "pkg.Type.Field". A comment over several
// fields ("StdoutStart and StderrStart are …") is each one's.
func fieldDocs(root string, dirs ...string) (map[string]string, error) {
	docs := map[string]string{}
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			return nil, err
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
			if err != nil {
				return nil, err
			}
			ast.Inspect(file, func(n ast.Node) bool {
				spec, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := spec.Type.(*ast.StructType)
				if !ok {
					return false
				}
				for _, f := range st.Fields.List {
					text := oneParagraph(f.Doc.Text())
					for _, name := range f.Names {
						if text != "" {
							docs[file.Name.Name+"."+spec.Name.Name+"."+name.Name] = text
						}
					}
				}
				return false
			})
		}
	}
	return docs, nil
}

// oneParagraph joins a comment's lines into one line per paragraph.
func oneParagraph(text string) string {
	paras := strings.Split(strings.TrimSpace(text), "\n\n")
	for i, p := range paras {
		paras[i] = strings.Join(strings.Fields(p), " ")
	}
	return strings.Join(paras, "\n\n")
}
