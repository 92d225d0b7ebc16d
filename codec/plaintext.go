package codec

import (
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
)

// EnvAllowPlaintext is the environment variable that, set to 1, lets a
// worker with a key ring take workflow and Update inputs that arrived
// unencrypted (the worker's --allow-plaintext-input).
const EnvAllowPlaintext = "SANDBOXFLOW_ALLOW_PLAINTEXT"

// PlaintextRefuser is implemented by the inputs that a worker holding a key
// ring must not take in plain text: RunCommand's and a session's input and
// the inputs of the session's Updates (package workflows). DataConverter
// calls RefusePlaintext after it decoded such a value from a payload that
// arrived unencrypted; the value then fails its own validation, so the
// workflow fails, or the Update is rejected, as SandboxInvalidInput before
// anything runs.
//
// A refusal in the converter itself would be an untyped decoding error;
// this way it is the taxonomy's typed, non-retryable failure, raised where
// every other bad input is. The inputs of your own workflows refuse plain
// text only if they implement it too.
type PlaintextRefuser interface {
	RefusePlaintext()
}

// refusingConverter marks the PlaintextRefusers it decodes from plain-text
// payloads. Everything else it leaves to the converter it wraps.
type refusingConverter struct {
	converter.DataConverter
}

func (c refusingConverter) FromPayload(p *commonpb.Payload, valuePtr any) error {
	if err := c.DataConverter.FromPayload(p, valuePtr); err != nil {
		return err
	}
	refuseIfPlain(p, valuePtr)
	return nil
}

func (c refusingConverter) FromPayloads(ps *commonpb.Payloads, valuePtrs ...any) error {
	if err := c.DataConverter.FromPayloads(ps, valuePtrs...); err != nil {
		return err
	}
	for i, p := range ps.GetPayloads() {
		if i < len(valuePtrs) {
			refuseIfPlain(p, valuePtrs[i])
		}
	}
	return nil
}

// refuseIfPlain tells a PlaintextRefuser decoded from an unencrypted
// payload (p as it arrived, before the codec) that it must refuse.
func refuseIfPlain(p *commonpb.Payload, valuePtr any) {
	if r, ok := valuePtr.(PlaintextRefuser); ok && !encrypted(p) {
		r.RefusePlaintext()
	}
}
