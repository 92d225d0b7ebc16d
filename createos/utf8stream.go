package createos

import (
	"strings"
	"unicode/utf8"
)

// utf8Stream decodes a byte stream that arrives in pieces as UTF-8 text. A
// character split across two pieces is held back and decoded whole with
// the later one. Invalid input becomes U+FFFD, one per maximal ill-formed
// subsequence, as the WHATWG Encoding Standard (and so a browser's or
// Node's TextDecoder) does.
type utf8Stream struct {
	held [utf8.UTFMax - 1]byte // the start of a character cut by the end of a piece
	n    int
}

const replacement = "\uFFFD"

// decode returns the text of p, after whatever an earlier piece held back.
func (d *utf8Stream) decode(p []byte) string {
	b := p
	if d.n > 0 {
		b = append(d.held[:d.n:d.n], p...)
		d.n = 0
	}
	body := b[:len(b)-incompleteSuffix(b)]
	d.n = copy(d.held[:], b[len(body):])
	if utf8.Valid(body) {
		return string(body)
	}
	var sb strings.Builder
	sb.Grow(len(body) + 2*len(replacement))
	for i := 0; i < len(body); {
		if body[i] < utf8.RuneSelf {
			sb.WriteByte(body[i])
			i++
			continue
		}
		if r, size := utf8.DecodeRune(body[i:]); r != utf8.RuneError || size > 1 {
			sb.Write(body[i : i+size])
			i += size
			continue
		}
		sb.WriteString(replacement)
		i += illFormedLen(body[i:])
	}
	return sb.String()
}

// flush ends the stream: a character still incomplete becomes U+FFFD.
func (d *utf8Stream) flush() string {
	if d.n == 0 {
		return ""
	}
	d.n = 0
	return replacement
}

// incompleteSuffix returns the length (0 to 3) of the end of b that starts
// a character but stops before its end: bytes to hold back for the next
// piece.
func incompleteSuffix(b []byte) int {
	for k := 1; k <= utf8.UTFMax-1 && k <= len(b); k++ {
		c := b[len(b)-k]
		if c < utf8.RuneSelf {
			return 0
		}
		if c < 0xC0 { // a continuation byte: look further back
			continue
		}
		if need, _, _ := leadByte(c); need < k || illFormedLen(b[len(b)-k:]) != k {
			return 0
		}
		return k
	}
	return 0
}

// leadByte returns how many continuation bytes follow the lead byte c
// (0 when c cannot start a character) and the range allowed for the first
// of them, which rules out overlong forms, surrogates and values above
// U+10FFFF.
func leadByte(c byte) (need int, lo, hi byte) {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 1, 0x80, 0xBF
	case c == 0xE0:
		return 2, 0xA0, 0xBF
	case c == 0xED:
		return 2, 0x80, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		return 2, 0x80, 0xBF
	case c == 0xF0:
		return 3, 0x90, 0xBF
	case c >= 0xF1 && c <= 0xF3:
		return 3, 0x80, 0xBF
	case c == 0xF4:
		return 3, 0x80, 0x8F
	}
	return 0, 0, 0
}

// illFormedLen returns the length of the maximal subpart at the start of b,
// which does not start with a whole valid character: the lead byte and the
// continuation bytes that still fit it (at least 1).
func illFormedLen(b []byte) int {
	need, lo, hi := leadByte(b[0])
	i := 1
	for ; i <= need && i < len(b); i++ {
		if b[i] < lo || b[i] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return i
}
