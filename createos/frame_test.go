package createos

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFrame(t *testing.T) {
	for line, want := range map[string]frame{
		`{"type":"heartbeat"}`: {kind: frameHeartbeat},
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}`:        {kind: frameData, seq: 1, stream: sandbox.Stdout, data: []byte("hi")},
		`{"type":"data","seq":9,"stream":"stderr","data_base64":""}`:            {kind: frameData, seq: 9, stream: sandbox.Stderr, data: []byte{}},
		` {"seq":2,"data_base64":"AA==","stream":"stdout","type":"data","x":1}`: {kind: frameData, seq: 2, stream: sandbox.Stdout, data: []byte{0}},
		`{"type":"exit","exit_code":0}`:                                         {kind: frameExit},
		`{"type":"exit","exit_code":-1}`:                                        {kind: frameExit, exit: exitStatus{code: -1}},
		`{"type":"exit","exit_code":null,"signal":"SIGKILL"}`:                   {kind: frameExit, exit: exitStatus{signal: "SIGKILL"}},
		`{"type":"exit","exit_code":137,"signal":"SIGKILL"}`:                    {kind: frameExit, exit: exitStatus{signal: "SIGKILL"}},
		`{"type":"error","error":"output_offset_expired"}`:                      {kind: frameError, code: "output_offset_expired"},
		`{"type":"error"}`: {kind: frameError},
	} {
		got, err := parseFrame([]byte(line), nil)
		require.NoError(t, err, line)
		assert.Equal(t, want, got, line)
	}
}

// Data frames in the layout servers write skip encoding/json; any other
// line goes through it, to be read (or rejected) in full.
func TestParseCanonicalData(t *testing.T) {
	for line, canonical := range map[string]bool{
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}`:                   true,
		`{"type":"data","seq":123456789012345678,"stream":"stderr","data_base64":""}`:      true,
		` {"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}`:                  false,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="} `:                  false,
		`{"type":"data","seq":0,"stream":"stdout","data_base64":"aGk="}`:                   false,
		`{"type":"data","seq":01,"stream":"stdout","data_base64":"aGk="}`:                  false,
		`{"type":"data","seq":1234567890123456789,"stream":"stdout","data_base64":"aGk="}`: false,
		`{"type":"data","seq":1,"stream":"tty","data_base64":"aGk="}`:                      false,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"a\/k="}`:                  false,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGl="}`:                   false,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk=","x":"y"}`:           false,
		`{"seq":1,"type":"data","stream":"stdout","data_base64":"aGk="}`:                   false,
	} {
		_, ok := parseCanonicalData([]byte(line), nil)
		assert.Equal(t, canonical, ok, line)
	}

	buf := make([]byte, 0, 16)
	fr, ok := parseCanonicalData([]byte(`{"type":"data","seq":7,"stream":"stderr","data_base64":"aGk="}`), buf)
	require.True(t, ok)
	assert.Equal(t, frame{kind: frameData, seq: 7, stream: sandbox.Stderr, data: []byte("hi")}, fr)
	assert.Same(t, &buf[:1][0], &fr.data[0], "the data is decoded into buf")
}

func TestParseFrameRejects(t *testing.T) {
	for line, kind := range map[string]sandbox.ProtocolKind{
		`null`:                    sandbox.InvalidFrame,
		`"data"`:                  sandbox.InvalidFrame,
		`[{"type":"heartbeat"}]`:  sandbox.InvalidFrame,
		`{"type":"heartbeat"} {}`: sandbox.InvalidFrame,
		`{"type":"heartbeat"`:     sandbox.InvalidFrame,
		`{}`:                      sandbox.InvalidFrame,
		`{"type":7}`:              sandbox.InvalidFrame,
		`{"type":"stdout"}`:       sandbox.UnknownEvent,
		`{"type":"data","seq":0,"stream":"stdout","data_base64":""}`:       sandbox.InvalidFrame,
		`{"type":"data","seq":1.5,"stream":"stdout","data_base64":""}`:     sandbox.InvalidFrame,
		`{"type":"data","seq":"1","stream":"stdout","data_base64":""}`:     sandbox.InvalidFrame,
		`{"type":"data","stream":"stdout","data_base64":""}`:               sandbox.InvalidFrame,
		`{"type":"data","seq":1,"data_base64":""}`:                         sandbox.InvalidFrame,
		`{"type":"data","seq":1,"stream":"tty","data_base64":""}`:          sandbox.InvalidFrame,
		`{"type":"data","seq":1,"stream":"stdout"}`:                        sandbox.InvalidFrame,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk"}`:    sandbox.BadBase64,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGl="}`:   sandbox.BadBase64, // non-zero padding bits
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aG\nk="}`: sandbox.BadBase64,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"a-k="}`:   sandbox.BadBase64,
		`{"type":"exit"}`:                    sandbox.MissingExitStatus,
		`{"type":"exit","exit_code":null}`:   sandbox.MissingExitStatus,
		`{"type":"exit","exit_code":1.0}`:    sandbox.MissingExitStatus,
		`{"type":"exit","exit_code":1e2}`:    sandbox.MissingExitStatus,
		`{"type":"exit","signal":"KILL"}`:    sandbox.MissingExitStatus,
		`{"type":"exit","signal":"SIG"}`:     sandbox.MissingExitStatus,
		`{"type":"exit","signal":"SIGkill"}`: sandbox.MissingExitStatus,
		`{"type":"exit","signal":9}`:         sandbox.MissingExitStatus,
	} {
		_, err := parseFrame([]byte(line), nil)
		var protocol *sandbox.ProtocolError
		if assert.ErrorAs(t, err, &protocol, line) {
			assert.Equal(t, kind, protocol.Kind, line)
		}
	}
}

func TestParseFrameNeverQuotesSecrets(t *testing.T) {
	_, err := parseFrame([]byte(`{"type":"secret-output-of-the-command that is long"}`), nil)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "secret")
	_, err = parseFrame([]byte(`{"type":"progress"}`), nil)
	assert.Contains(t, err.Error(), `"progress"`, "a short plain name helps debugging")
}

func TestLineReader(t *testing.T) {
	exact := strings.Repeat("x", maxFrame)
	r := lineReader{r: bufio.NewReaderSize(strings.NewReader("a\r\n\n"+exact+"\n"+exact+"x\nb\n"), 4096)}

	for _, want := range []string{"a", "", exact} {
		line, err := r.next()
		require.NoError(t, err)
		assert.Equal(t, want, string(line))
	}
	_, err := r.next()
	var protocol *sandbox.ProtocolError
	require.ErrorAs(t, err, &protocol)
	assert.Equal(t, sandbox.FrameTooLarge, protocol.Kind)

	r = lineReader{r: bufio.NewReader(strings.NewReader("whole\nbroken"))}
	_, err = r.next()
	require.NoError(t, err)
	_, err = r.next()
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "a line cut by the end of the stream is no line")
	_, err = r.next()
	assert.ErrorIs(t, err, io.EOF)
}

// FuzzParseFrame checks the parser's invariants on any line: it never
// panics, fails only with a *sandbox.ProtocolError whose text is short,
// and accepts data frames only when their base64 is the one encoding of
// their bytes.
func FuzzParseFrame(f *testing.F) {
	for _, seed := range []string{
		`{"type":"heartbeat"}`,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}`,
		`{"type":"data","seq":2,"stream":"stderr","data_base64":"w6k="}`,
		`{"type":"data","seq":3,"stream":"stdout","data_base64":""}`,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aGl="}`,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"aG\nk="}`,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"a\u0047k="}`,
		`{"type":"data","seq":9223372036854775807,"stream":"stdout","data_base64":"AA=="}`,
		`{"type":"data","seq":123456789012345678,"stream":"stderr","data_base64":"AA=="}`,
		`{"type":"data","seq":01,"stream":"stdout","data_base64":"AA=="}`,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"a\/k="}`,
		`{"type":"data","seq":1,"stream":"stdout","data_base64":"AA==" }`,
		"{\"type\":\"data\",\"seq\":1,\"stream\":\"stdout\",\"data_base64\":\"A\rA==\"}",
		`{"type":"exit","exit_code":0}`,
		`{"type":"exit","signal":"SIGKILL"}`,
		`{"type":"exit"}`,
		`{"type":"error","error":"output_offset_expired"}`,
		`{"type":"unknown"}`,
		`[1]`, `null`, `{`, ``, `{"TYPE":"data","SEQ":1,"Stream":"stdout","Data_Base64":"AA=="}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if fast, ok := parseCanonicalData(line, nil); ok {
			// The fast path of data frames reads them as encoding/json does.
			slow, err := parseJSONFrame(line)
			if err != nil || !reflect.DeepEqual(fast, slow) {
				t.Fatalf("the canonical data frame parser gives %+v, encoding/json %+v, %v", fast, slow, err)
			}
		}
		fr, err := parseFrame(line, nil)
		if err != nil {
			var protocol *sandbox.ProtocolError
			if !errors.As(err, &protocol) {
				t.Fatalf("error %T is not a *sandbox.ProtocolError", err)
			}
			if len(err.Error()) > 160 {
				t.Fatalf("error text too long, it may quote the frame: %q", err.Error())
			}
			return
		}
		switch fr.kind {
		case frameHeartbeat, frameError:
		case frameData:
			var w struct {
				Data string `json:"data_base64"`
			}
			if err := json.Unmarshal(line, &w); err != nil {
				t.Fatalf("accepted a frame encoding/json rejects: %v", err)
			}
			if got := base64.StdEncoding.EncodeToString(fr.data); got != w.Data {
				t.Fatalf("data_base64 %q does not round-trip: re-encoded %q", w.Data, got)
			}
			if fr.seq < 1 || (fr.stream != sandbox.Stdout && fr.stream != sandbox.Stderr) {
				t.Fatalf("accepted seq %d stream %q", fr.seq, fr.stream)
			}
		case frameExit:
			if fr.exit.signal != "" && (!validSignal(fr.exit.signal) || fr.exit.code != 0) {
				t.Fatalf("accepted exit %+v", fr.exit)
			}
		default:
			t.Fatalf("no kind: %+v", fr)
		}
	})
}
