package sandbox

import (
	"encoding/json"
	"fmt"
)

// The size limits of a command. Each is checked by Command.Validate (and
// the payload limit by CheckPayloadSize) before anything is sent, so a
// command that could not run fails as an *InvalidInputError naming the
// limit, its value and the size found — never as an API error after a
// lease was created for it.
const (
	// MaxArgBytes is the longest one argument, or one NAME=value of Env,
	// can be: Linux refuses any single string of an execve longer than
	// MAX_ARG_STRLEN (32 pages, 128 KiB) counting its NUL, whatever the
	// total. No way of starting the program avoids it.
	MaxArgBytes = 128<<10 - 1

	// MaxArgvEnvBytes bounds argv and Env together, counted as the kernel
	// counts them against ARG_MAX: each string's bytes, its NUL and an
	// 8-byte pointer. ARG_MAX is a quarter of the stack limit, 2 MiB with
	// the usual 8 MiB (measured in a lease of the local server: `getconf
	// ARG_MAX` prints 2097152); half of it is left to what the command
	// does not control: the sandbox's own environment, the program's path,
	// a smaller stack limit.
	MaxArgvEnvBytes = 1 << 20

	// MaxStdinBytes bounds Stdin. It travels inside the workflow's input
	// and in Execute's, so it is stored in history (base64, a third
	// larger) and replayed: Temporal warns about payloads over 512 KiB,
	// and refuses them over 2 MiB. Larger input belongs in a file the
	// command fetches, not in history.
	MaxStdinBytes = 512 << 10

	// MaxPayloadBytes bounds a workflow input or Update argument that
	// carries a command, as the data converter encodes it (JSON): Temporal's
	// blob size limit is 2 MiB per payload by default
	// (limit.blobSize.error); the rest is left to the payload's metadata
	// and an encrypting codec's envelope. JSON makes some bytes larger (a
	// control character or '<' takes 6), so argv within MaxArgvEnvBytes may
	// still exceed it.
	MaxPayloadBytes = 1536 << 10
)

// checkSizes checks the command against MaxArgBytes, MaxArgvEnvBytes and
// MaxStdinBytes. Its errors never hold an environment value.
func (c Command) checkSizes() error {
	const pointer = 8
	total := 0
	for i, arg := range c.Argv {
		if len(arg) > MaxArgBytes {
			return tooLarge(fmt.Sprintf("argv[%d]", i), "one argument", len(arg), MaxArgBytes)
		}
		total += len(arg) + 1 + pointer
	}
	for name, value := range c.Env {
		n := len(name) + 1 + len(value)
		if n > MaxArgBytes {
			return tooLarge("env", "one variable ("+name+"=value)", n, MaxArgBytes)
		}
		total += n + 1 + pointer
	}
	if total > MaxArgvEnvBytes {
		return tooLarge("argv", "argv and env together (each string, its NUL and a pointer)", total, MaxArgvEnvBytes)
	}
	if len(c.Stdin) > MaxStdinBytes {
		return StdinTooLarge(int64(len(c.Stdin)))
	}
	return nil
}

// StdinTooLarge is the error for n bytes of stdin, more than
// MaxStdinBytes; a negative n means a size not known beyond that (a pipe
// read up to the limit). It says what to do instead.
func StdinTooLarge(n int64) error {
	size := "more than its limit"
	if n >= 0 {
		size = fmt.Sprintf("%d bytes, more than its limit", n)
	}
	return &InvalidInputError{Field: "stdin", Reason: fmt.Sprintf(
		"stdin is %s of %d bytes (sandbox.MaxStdinBytes): stdin travels in workflow history; "+
			"let the command fetch a larger input itself, or pass it in parts", size, MaxStdinBytes)}
}

// CheckPayloadSize returns an *InvalidInputError when v, encoded as the
// default data converter encodes it, is larger than MaxPayloadBytes. what
// names v in the error ("request").
func CheckPayloadSize(what string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return &InvalidInputError{Field: what, Reason: "cannot be encoded: " + err.Error()}
	}
	if len(data) > MaxPayloadBytes {
		return tooLarge(what, "a Temporal payload (its JSON)", len(data), MaxPayloadBytes)
	}
	return nil
}

func tooLarge(field, what string, n, limit int) error {
	return &InvalidInputError{Field: field, Reason: fmt.Sprintf("%s is %d bytes, more than the limit of %d bytes for %s", field, n, limit, what)}
}
