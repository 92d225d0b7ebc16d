package sandbox

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// JSONDuration decodes a time.Duration from JSON given either as an
// integer of nanoseconds (as Go encodes a time.Duration) or as a Go
// duration string ("10s", "1m30s"), so that callers in other languages
// need not count nanoseconds. Anything else fails with a
// *json.UnmarshalTypeError, which encoding/json completes with the
// field's JSON path ("command.timeout"). Durations are always encoded as
// integers of nanoseconds.
type JSONDuration time.Duration

var durationType = reflect.TypeFor[time.Duration]()

func (d *JSONDuration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	bad := &json.UnmarshalTypeError{Value: "value " + string(b), Type: durationType}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return bad
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			bad.Value = "string " + strconv.Quote(s) + " (want a Go duration such as \"10s\" or integer nanoseconds)"
			return bad
		}
		*d = JSONDuration(v)
		return nil
	}
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return bad
	}
	*d = JSONDuration(v)
	return nil
}

// UnmarshalJSON accepts Timeout as integer nanoseconds or a Go duration
// string (JSONDuration).
func (c *Command) UnmarshalJSON(b []byte) error {
	type plain Command
	aux := struct {
		*plain
		Timeout *JSONDuration `json:"timeout,omitempty"`
	}{plain: (*plain)(c), Timeout: (*JSONDuration)(&c.Timeout)}
	return json.Unmarshal(b, &aux)
}

// UnmarshalJSON accepts AutoPauseAfter as integer nanoseconds or a Go
// duration string (JSONDuration).
func (s *LeaseSpec) UnmarshalJSON(b []byte) error {
	type plain LeaseSpec
	aux := struct {
		*plain
		AutoPauseAfter *JSONDuration `json:"autoPauseAfter,omitempty"`
	}{plain: (*plain)(s), AutoPauseAfter: (*JSONDuration)(&s.AutoPauseAfter)}
	return json.Unmarshal(b, &aux)
}

// DecodeError turns the error of decoding an input's JSON into the
// *InvalidInputError that names the field at fault by its JSON path, or
// "input" when no field is known (the input is not a JSON object).
func DecodeError(err error) error {
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if ok := asTypeError(err, &typeErr); ok && typeErr.Field != "" {
		// The decoders above embed the type they decode as "plain", which
		// encoding/json counts in the path.
		field := strings.ReplaceAll(typeErr.Field, "plain.", "")
		return &InvalidInputError{Field: field, Reason: "cannot take " + typeErr.Value}
	}
	return &InvalidInputError{Field: "input", Reason: "not the JSON of this input: " + err.Error()}
}

func asTypeError(err error, target **json.UnmarshalTypeError) bool {
	t, ok := err.(*json.UnmarshalTypeError)
	if ok {
		*target = t
	}
	return ok
}
