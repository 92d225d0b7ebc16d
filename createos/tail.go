package createos

import "unicode/utf8"

// tail keeps the last max bytes of a UTF-8 text written in pieces, cut at a
// character boundary, in at most about twice max bytes of memory whatever
// the text's length.
type tail struct {
	max     int
	buf     []byte
	written int64 // bytes written in all
	dropped bool  // some text was thrown away
}

func newTail(max int) tail { return tail{max: max} }

// write appends s, which must be valid UTF-8 (whole characters).
func (t *tail) write(s string) {
	t.buf = append(t.buf, s...)
	t.written += int64(len(s))
	if len(t.buf) > 2*t.max {
		t.trim()
	}
}

// String returns the kept text: at most max bytes, whole characters.
func (t *tail) String() string {
	t.trim()
	return string(t.buf)
}

// start returns the offset in the text of String's first byte.
func (t *tail) start() int64 {
	t.trim()
	return t.written - int64(len(t.buf))
}

// truncated reports whether String lacks a part of the text.
func (t *tail) truncated() bool {
	t.trim()
	return t.dropped
}

// trim throws away all but the last max bytes, and then the rest of a
// character that the cut went through.
func (t *tail) trim() {
	if len(t.buf) <= t.max {
		return
	}
	cut := len(t.buf) - t.max
	for cut < len(t.buf) && !utf8.RuneStart(t.buf[cut]) {
		cut++
	}
	t.buf = t.buf[:copy(t.buf, t.buf[cut:])]
	t.dropped = true
}
