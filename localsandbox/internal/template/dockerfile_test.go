package template

import (
	"errors"
	"reflect"
	"strings"
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
USER root
`)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := df.Plan(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantEnv := map[string]string{"GREETING": "hello world", "MODE": "test", "LEGACY": "some value"}
	if df.From != "devbox:1" || !reflect.DeepEqual(plan.Config, Config{Env: wantEnv, WorkDir: "/opt/app"}) {
		t.Fatalf("from %q config %+v", df.From, plan.Config)
	}
	if len(plan.Steps) != 4 {
		t.Fatalf("%d steps: %+v", len(plan.Steps), plan.Steps)
	}
	mk, run, exec := plan.Steps[1], plan.Steps[2], plan.Steps[3]
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
		{"FROM a\nUSER app\nRUN id\n", "line 2: USER app: a template cannot end as another user than root: sandboxd runs its sandboxes' commands as their root, not as a template's user (end the Dockerfile with USER root; the steps before it run as USER says)"},
		{"FROM a\nENV X=${Y:-z}\n", "line 2: ENV: ${Y:-z}: only $NAME and ${NAME} are supported"},
		{"FROM a\nWORKDIR ${X\n", "line 2: WORKDIR: unterminated ${"},
		{"# only a comment\n", "the Dockerfile is empty"},
	} {
		_, err := Parse(c.src)
		var pe *Error
		if !errors.As(err, &pe) || err.Error() != c.want {
			t.Errorf("Parse(%q) = %v, want %q", c.src, err, c.want)
		}
	}
}

// ENV, ARG, WORKDIR and USER expand $NAME and ${NAME} as Docker does:
// from the ENVs and ARGs before them, the base's Config, then the lease's
// own variables; not in single quotes nor after a backslash. The Config
// is the base's with the file's ENVs over it.
func TestPlanExpandsVariablesOverTheBase(t *testing.T) {
	df, err := Parse(`FROM parent
ARG TOOL=tool
ENV PATH=/opt/${TOOL}/bin:$PATH HOME_COPY="$HOME" LIT='$PATH' ESC=\$PATH
ENV SEEN $INHERITED-$UNSET-x
WORKDIR $INHERITED
USER root
RUN true
`)
	if err != nil {
		t.Fatal(err)
	}
	base := Config{Env: map[string]string{"INHERITED": "from-parent"}, WorkDir: "/srv"}
	plan, err := df.Plan(base, map[string]string{"PATH": "/usr/bin:/bin", "HOME": "/workspace"})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Env: map[string]string{"INHERITED": "from-parent", "PATH": "/opt/tool/bin:/usr/bin:/bin",
		"HOME_COPY": "/workspace", "LIT": "$PATH", "ESC": "$PATH", "SEEN": "from-parent--x"}, WorkDir: "/srv/from-parent"}
	if !reflect.DeepEqual(plan.Config, want) {
		t.Errorf("config %+v\nwant   %+v", plan.Config, want)
	}
	if run := plan.Steps[len(plan.Steps)-1]; run.Dir != "/srv/from-parent" || run.User != "root" || run.Env["PATH"] != "/opt/tool/bin:/usr/bin:/bin" || run.Env["TOOL"] != "tool" {
		t.Errorf("the RUN step %+v", run)
	}
	// On a base without the variable, the WORKDIR of it is the root.
	plan, err = df.Plan(Config{}, nil)
	if err != nil || plan.Config.WorkDir != "/" {
		t.Errorf("%+v %v", plan.Config, err)
	}
	// Without a WORKDIR of its own or its base's, a template leaves the
	// working directory to the lease.
	if df, _ := Parse("RUN true\n"); df != nil {
		if plan, _ := df.Plan(base, nil); !reflect.DeepEqual(plan.Config, base) {
			t.Errorf("a Dockerfile without ENV or WORKDIR: %+v, want its base's", plan.Config)
		}
		if plan, _ := df.Plan(Config{}, nil); !reflect.DeepEqual(plan.Config, Config{}) {
			t.Errorf("nothing set: %+v", plan.Config)
		}
	}
}

func TestParseWithoutFrom(t *testing.T) {
	df, err := Parse("RUN true\n")
	if err != nil || df.From != "" {
		t.Fatalf("%+v %v", df, err)
	}
	if plan, err := df.Plan(Config{}, nil); err != nil || len(plan.Steps) != 1 {
		t.Fatalf("%+v %v", plan, err)
	}
}

// A Dockerfile cannot make the server expand variables without bound:
// ENV A=$A$A doubles A at each line (40 lines would be a TiB), and many
// pairs of one large variable add up. Each is refused, naming its line.
func TestParseBoundsWhatVariablesExpandTo(t *testing.T) {
	doubling := func(line string, n int) string {
		return "ENV A=x\n" + strings.Repeat(line+"\n", n)
	}
	pairs := doubling("ENV A=$A$A", 16) + "ENV" + strings.Repeat(" B=$A", 20) + "\n" // 20 × 64 KiB
	for name, src := range map[string]string{
		"ENV K=V":     doubling("ENV A=$A$A", 22),
		"ENV K V":     doubling("ENV A $A$A", 22),
		"ARG":         "ARG A=x\n" + strings.Repeat("ARG A=${A}${A}\n", 22),
		"WORKDIR":     doubling("ENV A=$A$A", 17) + "WORKDIR /$A$A$A$A$A$A$A$A$A\n", // 9 × 128 KiB
		"many pairs":  pairs,
		"one of each": doubling("ENV A=$A$A", 19) + "ENV B=$A C=$A D=$A\n",
	} {
		_, err := Parse(src)
		var e *Error
		if !errors.As(err, &e) || e.Line == 0 || !strings.Contains(e.Msg, "more than") {
			t.Errorf("%s: %v, want an *Error of its line naming the bound", name, err)
		}
	}
	// Below the bound, a large variable is fine.
	if _, err := Parse(doubling("ENV A=$A$A", 18) + "RUN true\n"); err != nil {
		t.Errorf("256 KiB of variables: %v", err)
	}
}
