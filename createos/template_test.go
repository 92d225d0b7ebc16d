package createos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

const testDockerfile = "FROM devbox:1\nRUN echo baked > /opt/baked\n"

// The same Dockerfile is built once: the second ensure finds the ready
// template by its content's name and neither creates nor follows it.
func TestEnsureTemplateBuildsTheSameDockerfileOnce(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	spec := sandbox.TemplateSpec{Dockerfile: testDockerfile}
	var logged []string
	first, err := c.EnsureTemplate(context.Background(), spec, func(line string) { logged = append(logged, line) })
	require.NoError(t, err)
	assert.Equal(t, spec.Name(), first.Name)
	assert.True(t, strings.HasPrefix(first.ID, "tpl-"), first.ID)
	assert.Equal(t, []string{"step 1/1"}, logged)

	second, err := c.EnsureTemplate(context.Background(), spec, nil)
	require.NoError(t, err)
	assert.Equal(t, first, second)
	assert.Equal(t, 1, f.count("createTemplate"))
	assert.Equal(t, 1, f.count("followTemplate"))

	other, err := c.EnsureTemplate(context.Background(), sandbox.TemplateSpec{Dockerfile: testDockerfile + "RUN true\n"}, nil)
	require.NoError(t, err)
	assert.NotEqual(t, first.Name, other.Name, "another content, another template")
	assert.Equal(t, 2, f.count("createTemplate"))
}

// A failed build is a non-retryable SandboxTemplateBuildFailed carrying
// the end of its log, bounded; ensuring it again fails the same way
// without a rebuild.
func TestEnsureTemplateFailsTypedWithTheLogTail(t *testing.T) {
	f := newFakeServer(t)
	f.build = func(string) ([]string, bool) {
		lines := make([]string, 2000)
		for i := range lines {
			lines[i] = fmt.Sprintf("output line %d", i)
		}
		return append(lines, "line 2: RUN false: exited with code 1"), false
	}
	c := newTestClient(t, f)
	spec := sandbox.TemplateSpec{Dockerfile: "FROM devbox:1\nRUN false\n"}
	for range 2 {
		_, err := c.EnsureTemplate(context.Background(), spec, nil)
		var build *sandbox.TemplateBuildError
		require.ErrorAs(t, err, &build)
		assert.Equal(t, spec.Name(), build.Name)
		assert.True(t, strings.HasSuffix(build.LogTail, "output line 1999\nline 2: RUN false: exited with code 1\n"), build.LogTail[max(0, len(build.LogTail)-200):])
		assert.LessOrEqual(t, len(build.LogTail), TemplateLogTailBytes)
		assert.False(t, sandbox.Retryable(err))
		assert.Equal(t, sandbox.TypeTemplateBuildFailed, sandbox.DetailsOf(err).Kind)
	}
	assert.Equal(t, 1, f.count("createTemplate"), "a failed build of the same content is not built again")
}

// A template that holds the Dockerfile's name but was not built from it —
// a session's snapshot named so, or a build of another Dockerfile under the
// name — is refused, not run on: its files are not the Dockerfile's.
func TestEnsureTemplateRefusesATemplateOfItsNameMadeOtherwise(t *testing.T) {
	spec := sandbox.TemplateSpec{Dockerfile: testDockerfile}
	for name, squatter := range map[string]*fakeTemplate{
		"snapshot":         {id: "tpl-99", name: spec.Name(), status: "ready", fromSandbox: "sbx-1"},
		"other dockerfile": {id: "tpl-99", name: spec.Name(), status: "ready", dockerfile: "FROM devbox:1\nRUN echo planted > /opt/baked\n"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			f.templates[squatter.id] = squatter
			c := newTestClient(t, f)
			_, err := c.EnsureTemplate(context.Background(), spec, nil)
			assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
			assert.Equal(t, "dockerfile", sandbox.DetailsOf(err).Field)
			assert.False(t, sandbox.Retryable(err))
			assert.Zero(t, f.count("createTemplate"))
		})
	}
}

// Two runs racing for one Dockerfile: the loser's create is answered 409
// and it follows the winner's build instead.
func TestEnsureTemplateFollowsTheBuildThatWonTheName(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	winner := newTestClient(t, f)
	spec := sandbox.TemplateSpec{Dockerfile: testDockerfile}
	f.on("getTemplate", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n != 1 {
			return false
		}
		// The winner creates the template between the loser's GET and its POST.
		f.refuse(w, http.StatusNotFound, "NOT_FOUND")
		_, err := winner.createTemplate(r.Context(), spec.Name(), spec)
		require.NoError(t, err)
		return true
	})
	got, err := c.EnsureTemplate(context.Background(), spec, nil)
	require.NoError(t, err)
	assert.Equal(t, spec.Name(), got.Name)
	assert.Equal(t, 2, f.count("createTemplate"), "the winner's and the loser's")
	assert.Len(t, f.templates, 1)
}

// A follow that the server ends before the final event is resumed after a
// GET; the lines already passed on are not passed on again.
func TestEnsureTemplateResumesALogClosedEarly(t *testing.T) {
	f := newFakeServer(t)
	f.build = func(string) ([]string, bool) { return []string{"one", "two", "three"}, false }
	f.on("followTemplate", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n != 1 {
			return false
		}
		fmt.Fprintln(w, `{"line":"one"}`)
		return true
	})
	c := newTestClient(t, f)
	var logged []string
	_, err := c.EnsureTemplate(context.Background(), sandbox.TemplateSpec{Dockerfile: "RUN false\n"}, func(line string) { logged = append(logged, line) })
	var build *sandbox.TemplateBuildError
	require.ErrorAs(t, err, &build)
	assert.Equal(t, []string{"one", "two", "three"}, logged)
	assert.Equal(t, "one\ntwo\nthree\n", build.LogTail)
	assert.Equal(t, 2, f.count("followTemplate"))
}

// A Dockerfile over the bound fails before anything is sent.
func TestEnsureTemplateRefusesBadInputBeforeSending(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	for _, spec := range []sandbox.TemplateSpec{
		{},
		{Dockerfile: strings.Repeat("#", sandbox.MaxDockerfileBytes+1)},
	} {
		_, err := c.EnsureTemplate(context.Background(), spec, nil)
		var invalid *sandbox.InvalidInputError
		require.True(t, errors.As(err, &invalid), "%v", err)
		assert.Equal(t, "dockerfile", invalid.Field)
	}
	assert.Empty(t, f.routes())
}

// A create whose answer is lost fails retryably; the retry (a worker's
// next attempt) finds the build by its name instead of starting another.
func TestEnsureTemplateRetryFindsTheBuildOfALostCreate(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	f.on("createTemplate", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n != 1 {
			return false
		}
		f.createTemplate(httptest.NewRecorder(), r) // made, but the answer never comes
		loseAnswer(w)
		return true
	})
	spec := sandbox.TemplateSpec{Dockerfile: testDockerfile}
	_, err := c.EnsureTemplate(context.Background(), spec, nil)
	require.Error(t, err)
	assert.True(t, sandbox.Retryable(err), "%v", err)

	got, err := c.EnsureTemplate(context.Background(), spec, nil)
	require.NoError(t, err)
	assert.Equal(t, spec.Name(), got.Name)
	assert.Equal(t, 1, f.count("createTemplate"), "the retry does not create it again")
	assert.Len(t, f.templates, 1)
}
