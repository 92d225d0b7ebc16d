package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestTheKeyComesFromAFile(t *testing.T) {
	t.Setenv("SANDBOXD_API_KEY", "")
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	os.WriteFile(file, []byte("from-file\n"), 0o600)
	var stderr bytes.Buffer
	c, err := parseFlags([]string{"--api-key-file", file}, &stderr)
	if err != nil || c.apiKey != "from-file" || stderr.Len() != 0 {
		t.Errorf("%q, %v, stderr %q", c.apiKey, err, stderr.String())
	}
	os.Chmod(file, 0o640)
	if _, err := parseFlags([]string{"--api-key-file", file}, io.Discard); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a key file group may read: %v", err)
	}
	os.Chmod(file, 0o600)
	if _, err := parseFlags([]string{"--api-key-file", file, "--api-key", "k"}, io.Discard); err == nil {
		t.Error("--api-key and --api-key-file together were accepted")
	}
	c, err = parseFlags([]string{"--api-key", "on-the-line"}, &stderr)
	if err != nil || c.apiKey != "on-the-line" || !strings.Contains(stderr.String(), "every local user") {
		t.Errorf("--api-key: %q, %v, stderr %q", c.apiKey, err, stderr.String())
	}
	t.Setenv("SANDBOXD_API_KEY", "from-env")
	if c, err := parseFlags(nil, io.Discard); err != nil || c.apiKey != "from-env" || os.Getenv("SANDBOXD_API_KEY") != "" {
		t.Errorf("the variable: %q, %v; left in the environment: %q", c.apiKey, err, os.Getenv("SANDBOXD_API_KEY"))
	}
}

// The real binary, given its key by file, with a sandbox running (its init,
// slirp4netns): no process of the machine shows the key in its command
// line, nor in its environment (issue 26, item 5).
func TestNoProcessShowsTheKey(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("slirp4netns"); err != nil && os.Getenv("CI") != "true" {
		t.Skip("slirp4netns is not installed")
	}
	dir := t.TempDir()
	for _, pkg := range []string{".", "../sandboxflow-init"} {
		if out, err := exec.Command("go", "build", "-o", dir+"/", pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v: %s", pkg, err, out)
		}
	}
	key := fmt.Sprintf("key-%d-never-shown", time.Now().UnixNano())
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var stderr lockedBuffer // written by exec's copying goroutine while the test reads it
	cmd := exec.Command(filepath.Join(dir, "sandboxd"), "--api-key-file", keyFile, "--listen", addr,
		"--root", filepath.Join(dir, "root"), "--egress", "any")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	call := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, "http://"+addr+"/v1"+path, strings.NewReader(body))
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling: the server says nothing else when it listens
		if status, _ := call("GET", "/sandboxes", ""); status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd does not answer; stderr %s", stderr.String())
		}
	}
	if status, body := call("POST", "/sandboxes", `{"shape":"s-1vcpu-1gb","egress":["*"]}`); status != http.StatusOK && status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	seen := 0
	for _, p := range procs {
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(filepath.Join(p, f))
			if err != nil {
				continue // gone meanwhile
			}
			if bytes.Contains(b, []byte(key)) {
				t.Errorf("%s/%s shows the key: %q", p, f, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
			}
			if f == "cmdline" && (bytes.Contains(b, []byte("slirp4netns")) || bytes.Contains(b, []byte("sandboxflow-init"))) {
				seen++
			}
		}
	}
	if seen < 2 {
		t.Errorf("saw %d of the server's slirp4netns and init processes, want both", seen)
	}
	if strings.Contains(stderr.String(), key) {
		t.Error("the server's log shows the key")
	}
}

// lockedBuffer is a bytes.Buffer that a process's output goroutine may
// write while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
