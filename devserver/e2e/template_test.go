package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// writeDockerfile writes a Dockerfile for --dockerfile.
func writeDockerfile(t *testing.T, text string) string {
	path := filepath.Join(t.TempDir(), "Dockerfile")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}

// templateOf reads a template of the stack's sandbox server by name: its
// TemplateView.
func templateOf(t *testing.T, name string) (view struct{ ID, Name, Status string }) {
	s := stackOf(t)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.SandboxURL+"/v1/templates/"+name, nil)
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", s.SandboxAPIKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var envelope struct {
		Data struct{ ID, Name, Status string }
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&envelope))
	return envelope.Data
}

// The scenario: a command runs on the template of its Dockerfile;
// a second run of the same Dockerfile uses the same template (its
// EnsureTemplate finds it ready by its content's name: no create, no
// build); nothing is left behind.
func TestRunCommandOnTheTemplateOfItsDockerfile(t *testing.T) {
	testenv.RequireRoot(t, "templates are built in namespaced sandboxes")
	const text = "FROM devbox:1\nRUN echo baked > /opt/baked\n"
	dockerfile := writeDockerfile(t, text)
	name := sandbox.TemplateSpec{Dockerfile: text}.Name()

	code, stdout, stderr := runStarter(t, "", "--dockerfile", dockerfile, "--", "cat", "/opt/baked")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "baked\n", stdout)
	first := templateOf(t, name)
	assert.Equal(t, "ready", first.Status)

	code, stdout, stderr = runStarter(t, "", "--dockerfile", dockerfile, "--", "cat", "/opt/baked")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "baked\n", stdout)
	assert.Equal(t, first, templateOf(t, name), "the same template")
	assertNothingLeaked(t)
}

// A session from the starter takes a Dockerfile as a run does: its first
// command, sent with the session's start, waits for the build, and every
// command sees the template's ENV (a PATH it extended, a variable beneath
// the command's own); nothing is left behind.
func TestSessionOnTheTemplateOfItsDockerfile(t *testing.T) {
	testenv.RequireRoot(t, "templates are built in namespaced sandboxes")
	const text = "FROM devbox:1\nENV GREETING=from-the-template PATH=/opt/tool/bin:$PATH\n" +
		"RUN mkdir -p /opt/tool/bin && printf '#!/bin/sh\\necho tool-ran\\n' > /opt/tool/bin/mytool && chmod +x /opt/tool/bin/mytool\n"
	code, stdout, stderr := runStarter(t, "", "--dockerfile", writeDockerfile(t, text), "--then", "mytool", "--", "sh", "-c", "echo $GREETING")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "from-the-template\ntool-ran\n", stdout)
	assert.Equal(t, "ready", templateOf(t, sandbox.TemplateSpec{Dockerfile: text}.Name()).Status)
	assertNothingLeaked(t)
}

// A RUN that fails fails the run typed, with the end of the build's log,
// before any lease.
func TestRunCommandFailsTypedWhenItsDockerfileFails(t *testing.T) {
	testenv.RequireRoot(t, "templates are built in namespaced sandboxes")
	const text = "FROM devbox:1\nRUN echo about to fail && false\n"
	code, stdout, stderr := runStarter(t, "", "--dockerfile", writeDockerfile(t, text), "--workflow-id", "template-fails", "--", "true")
	assert.Equal(t, starterapp.ExitRunFailed, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "failed: SandboxTemplateBuildFailed: ")

	err := stackOf(t).Client.GetWorkflow(t.Context(), "template-fails", "").Get(t.Context(), nil)
	d := requireFailure(t, err, sandbox.TypeTemplateBuildFailed)
	assert.Equal(t, sandbox.TemplateSpec{Dockerfile: text}.Name(), d.Template)
	assert.Contains(t, d.LogTail, "about to fail")
	assert.Equal(t, "failed", templateOf(t, d.Template).Status)
	assertNothingLeaked(t)
}

// The snapshot scenario: a session writes a file in its
// workspace and over its image, keeps its lease as a template, writes on;
// a RunCommand on the template reads the files as they were at the
// snapshot, not the later write. Closing the session leaves nothing
// behind, and the session's history replays.
func TestSessionSnapshotIsATemplateARunStartsFrom(t *testing.T) {
	testenv.RequireRoot(t, "a snapshot copies a lease's namespaced root")
	s := stackOf(t)
	ctx := t.Context()
	sess, err := sandboxclient.StartSession(ctx, s.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue}, workflows.SessionRequest{})
	require.NoError(t, err)
	first := run(t, sess, "echo kept > f; echo machine > /etc/snapped")

	tpl, err := sess.Snapshot(ctx, "")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(tpl.ID, "tpl-"), tpl.ID)
	assert.Equal(t, "ready", templateOf(t, tpl.ID).Status)
	after := run(t, sess, "echo later > f; cat /etc/snapped")
	assert.Equal(t, first.LeaseID, after.LeaseID, "the session goes on on its lease")
	assert.Equal(t, "machine\n", after.Stdout)
	summary, err := sess.Close(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{first.LeaseID}, summary.DestroyedLeases)
	replayed(t, s.Client, sess.ID())

	code, stdout, stderr := runStarter(t, "", "--rootfs", tpl.ID, "--", "sh", "-c", "cat f /etc/snapped")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "kept\nmachine\n", stdout, "the template's files, as they were at the snapshot")

	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, s.SandboxURL+"/v1/templates/"+tpl.ID, nil)
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", s.SandboxAPIKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assertNothingLeaked(t)
}
