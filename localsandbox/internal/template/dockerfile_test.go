package template

import (
	"errors"
	"reflect"
	"testing"
)

func TestParseTheSubset(t *testing.T) {
	df, err := Parse(`# a template
FROM devbox:1
ARG VERSION=1.2
ARG UNSET
ENV GREETING="hello world" MODE=test
ENV LEGACY some value
WORKDIR /opt
WORKDIR app
RUN echo $GREETING \
    > marker
USER nobody
RUN ["/bin/true", "x"]
`)
	if err != nil {
		t.Fatal(err)
	}
	if df.From != "devbox:1" || df.Dir != "/opt/app" || df.User != "nobody" {
		t.Fatalf("from %q dir %q user %q", df.From, df.Dir, df.User)
	}
	wantEnv := map[string]string{"GREETING": "hello world", "MODE": "test", "LEGACY": "some value"}
	if !reflect.DeepEqual(df.Env, wantEnv) {
		t.Fatalf("env %v", df.Env)
	}
	if len(df.Steps) != 4 {
		t.Fatalf("%d steps: %+v", len(df.Steps), df.Steps)
	}
	mk, run, exec := df.Steps[1], df.Steps[2], df.Steps[3]
	if !reflect.DeepEqual(mk.Argv, []string{"mkdir", "-p", "--", "/opt/app"}) || mk.Dir != "/" || mk.Line != 8 {
		t.Fatalf("WORKDIR step %+v", mk)
	}
	if !reflect.DeepEqual(run.Argv, []string{"/bin/sh", "-c", "echo $GREETING  > marker"}) || run.Line != 9 || run.Dir != "/opt/app" || run.User != "" {
		t.Fatalf("RUN step %+v", run)
	}
	if run.Env["VERSION"] != "1.2" || run.Env["GREETING"] != "hello world" {
		t.Fatalf("RUN env %v", run.Env)
	}
	if _, ok := run.Env["UNSET"]; ok {
		t.Fatal("an ARG without default is set")
	}
	if !reflect.DeepEqual(exec.Argv, []string{"/bin/true", "x"}) || exec.User != "nobody" || exec.Line != 12 {
		t.Fatalf("exec-form step %+v", exec)
	}
}

func TestParseNamesTheLineOfWhatIsNotSupported(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"FROM devbox:1\nRUN true\nCOPY . /app\n", "line 3: COPY is not supported (a template's Dockerfile has FROM, RUN, ENV, WORKDIR, USER, ARG)"},
		{"FROM devbox:1\n\n  cmd [\"x\"]\n", "line 3: CMD is not supported (a template's Dockerfile has FROM, RUN, ENV, WORKDIR, USER, ARG)"},
		{"FROM devbox:1\nFROM devbox:1\n", "line 2: FROM must be the first instruction, and the only FROM"},
		{"FROM devbox:1 AS build\n", "line 1: FROM takes one image or template name (no flags, no AS)"},
		{"FROM a\nFOO bar\n", `line 2: unknown instruction "FOO"`},
		{"FROM a\nENV 1X=2\n", `line 2: ENV: bad variable name "1X"`},
		{"FROM a\nRUN [\"unterminated\"\n", "line 2: RUN's exec form must be a JSON array of strings"},
		{"FROM a\nUSER app:staff\n", "line 2: USER takes one user (its own group; user:group is not supported)"},
		{"# only a comment\n", "the Dockerfile is empty"},
	} {
		_, err := Parse(c.src)
		var pe *Error
		if !errors.As(err, &pe) || err.Error() != c.want {
			t.Errorf("Parse(%q) = %v, want %q", c.src, err, c.want)
		}
	}
}

func TestParseWithoutFrom(t *testing.T) {
	df, err := Parse("RUN true\n")
	if err != nil || df.From != "" || len(df.Steps) != 1 {
		t.Fatalf("%+v %v", df, err)
	}
}
