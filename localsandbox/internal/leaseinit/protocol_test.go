package leaseinit_test

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// FuzzStatusLine: whatever arrives on a status pipe, the decoder never
// panics, never accepts more than MaxStatusLine, and what the init encodes
// — whatever its failure text says — always fits and reads back the same.
func FuzzStatusLine(f *testing.F) {
	f.Add([]byte(`{"exited":true,"exit_code":7}`), "")
	f.Add([]byte(`{"started":true}`), "command not found")
	f.Add([]byte(`{"failure":"`+strings.Repeat("\x01", 600)+`"}`), strings.Repeat("\x00", 4096))
	f.Add([]byte("not json"), "\xff\xfe")
	f.Fuzz(func(t *testing.T, line []byte, failure string) {
		if msg, ok := leaseinit.DecodeStatus(line); ok && len(line) > leaseinit.MaxStatusLine {
			t.Fatalf("accepted a %d-byte line: %+v", len(line), msg)
		}
		sent := leaseinit.Status{Failure: failure, FailureKind: leaseinit.FailCommand, ExitCode: len(failure)}
		enc := sent.Encode()
		if len(enc) > leaseinit.MaxStatusLine+1 {
			t.Fatalf("a failure of %d bytes encodes to a %d-byte line", len(failure), len(enc))
		}
		got, ok := leaseinit.DecodeStatus(bytes.TrimSuffix(enc, []byte("\n")))
		if !ok || got.ExitCode != sent.ExitCode || got.FailureKind != sent.FailureKind || !utf8.ValidString(got.Failure) {
			t.Fatalf("%q read back as %+v, %v", enc, got, ok)
		}
	})
}
