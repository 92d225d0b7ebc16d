package createos

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// whatwgDecode is the UTF-8 decoder of the WHATWG Encoding Standard,
// written as the standard states it, byte by byte: the reference that
// utf8Stream must match whatever the pieces.
func whatwgDecode(b []byte) string {
	var (
		out          []rune
		cp           rune
		needed, seen int
		lower, upper byte = 0x80, 0xBF
	)
	for i := 0; i < len(b); {
		c := b[i]
		if needed == 0 {
			switch {
			case c <= 0x7F:
				out = append(out, rune(c))
			case c >= 0xC2 && c <= 0xDF:
				needed, cp = 1, rune(c&0x1F)
			case c >= 0xE0 && c <= 0xEF:
				if c == 0xE0 {
					lower = 0xA0
				}
				if c == 0xED {
					upper = 0x9F
				}
				needed, cp = 2, rune(c&0x0F)
			case c >= 0xF0 && c <= 0xF4:
				if c == 0xF0 {
					lower = 0x90
				}
				if c == 0xF4 {
					upper = 0x8F
				}
				needed, cp = 3, rune(c&0x07)
			default:
				out = append(out, utf8.RuneError)
			}
			i++
			continue
		}
		if c < lower || c > upper {
			// An error; the byte is processed again as a new start.
			cp, needed, seen, lower, upper = 0, 0, 0, 0x80, 0xBF
			out = append(out, utf8.RuneError)
			continue
		}
		lower, upper = 0x80, 0xBF
		cp = cp<<6 | rune(c&0x3F)
		seen++
		i++
		if seen == needed {
			out = append(out, cp)
			cp, needed, seen = 0, 0, 0
		}
	}
	if needed != 0 {
		out = append(out, utf8.RuneError)
	}
	return string(out)
}

// decodeInPieces decodes b cut at the given points.
func decodeInPieces(b []byte, cuts ...int) string {
	var d utf8Stream
	var out string
	prev := 0
	for _, cut := range cuts {
		out += d.decode(b[prev:cut])
		prev = cut
	}
	return out + d.decode(b[prev:]) + d.flush()
}

func TestUTF8StreamVectors(t *testing.T) {
	for in, want := range map[string]string{
		"plain":            "plain",
		"é✓😀":              "é✓😀",
		"\xe2\x82A":        "\uFFFDA",            // one maximal subpart
		"\xf0\x80\x80":     "\uFFFD\uFFFD\uFFFD", // F0 cannot take 80
		"\xed\xa0\x80":     "\uFFFD\uFFFD\uFFFD", // a surrogate
		"\xc0\xaf":         "\uFFFD\uFFFD",       // overlong
		"\xf4\x90\x80\x80": "\uFFFD\uFFFD\uFFFD\uFFFD",
		"\xff":             "\uFFFD",
		"a\xf0\x9f\x98":    "a\uFFFD", // cut at the end: one, at the flush
		"\xe2\xe2\x82\xac": "\uFFFD€",
	} {
		assert.Equal(t, want, decodeInPieces([]byte(in)), "%q", in)
		assert.Equal(t, want, whatwgDecode([]byte(in)), "reference %q", in)
	}
}

func TestUTF8StreamHoldsSplitCharacters(t *testing.T) {
	var d utf8Stream
	assert.Equal(t, "a", d.decode([]byte("a\xf0")))
	assert.Equal(t, "", d.decode([]byte("\x9f")))
	assert.Equal(t, "", d.decode([]byte("\x98")))
	assert.Equal(t, "😀b", d.decode([]byte("\x80b")))
	assert.Equal(t, "", d.flush())
}

func TestUTF8StreamEverySplit(t *testing.T) {
	in := []byte("aé✓😀\xe2\x82\xf0\x9f\x98x\xed\xa0\x80\xc3")
	want := whatwgDecode(in)
	for i := 0; i <= len(in); i++ {
		for j := i; j <= len(in); j++ {
			assert.Equal(t, want, decodeInPieces(in, i, j), "cut at %d and %d", i, j)
		}
	}
}

// FuzzUTF8Stream checks the streaming decoder against the reference, cut
// anywhere.
func FuzzUTF8Stream(f *testing.F) {
	f.Add([]byte("aé✓😀"), uint8(2), uint8(5))
	f.Add([]byte("\xe2\x82A\xf0\x80\x80\xed\xa0\x80"), uint8(1), uint8(4))
	f.Fuzz(func(t *testing.T, in []byte, a, b uint8) {
		i, j := int(a)%(len(in)+1), int(b)%(len(in)+1)
		if i > j {
			i, j = j, i
		}
		got := decodeInPieces(in, i, j)
		if want := whatwgDecode(in); got != want {
			t.Fatalf("%q cut at %d, %d: got %q, want %q", in, i, j, got, want)
		}
	})
}
