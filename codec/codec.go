// Package codec encrypts what sandboxflow puts in Temporal workflow history.
//
// Temporal stores every workflow input and result, every activity input,
// result and heartbeat, in plain text unless a PayloadCodec encodes them on
// the client side. This package's codec encrypts each payload with
// AES-256-GCM under the current key of a key ring ([Keys]), so the Temporal
// server, its database and anyone reading them see ciphertext; the workers
// and starters that hold the ring see values.
//
// Turn it on by giving every client the same ring — the worker, the
// starter and anything else that starts or reads runs:
//
//	keys, err := codec.LoadKeys(os.Getenv) // SANDBOXFLOW_CODEC_KEYS or SANDBOXFLOW_CODEC_KEYS_FILE
//	options.DataConverter = codec.DataConverter(keys)
//	options.FailureConverter = codec.FailureConverter(keys)
//
// To let the Temporal Web UI show decoded payloads, run a codec server
// ([NewHTTPHandler]) where the operator's browser can reach it and point the
// UI's codec endpoint at it: the UI then sends the payloads it displays to
// that endpoint to decrypt them, and the server keeps only ciphertext.
//
// What stays plain text: workflow and activity type names, ids, task
// queues, timestamps, search attributes, and the error types of failures
// (their messages and stack traces are encrypted by FailureConverter).
// Secrets belong in workflows.Request.SecretEnv all the same: the codec
// protects history, not the worker's environment.
package codec

import (
	"errors"
	"fmt"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/proto"
)

// Metadata of an encrypted payload.
const (
	// Encoding is the encoding marker of a payload this codec encrypted,
	// under the standard metadata key converter.MetadataEncoding.
	Encoding = "binary/encrypted"
	// MetadataKeyID names the key that encrypted the payload.
	MetadataKeyID = "encryption-key-id"
)

// aadPrefix binds a ciphertext to this format and to its key id, so that a
// payload whose metadata was edited fails to decrypt instead of decrypting
// under a key it does not name.
const aadPrefix = "sandboxflow/codec/v1\x00"

// payloadCodec is NewPayloadCodec's codec.
type payloadCodec struct {
	keys *Keys
}

// NewPayloadCodec returns a converter.PayloadCodec that encrypts every
// payload with AES-256-GCM under the ring's current key and a random nonce.
// The whole original payload (its metadata too: the JSON encoding marker
// would tell what kind of value it is) becomes the ciphertext; the new
// payload's metadata holds only the Encoding marker and the key id.
//
// Decode decrypts payloads marked with Encoding under the key they name, and
// returns every other payload as it is, so that histories written before
// encryption was turned on stay readable. A payload under a key id the ring
// does not hold, or whose ciphertext was altered, is an error that names the
// key id and nothing else. k must not be nil.
func NewPayloadCodec(k *Keys) converter.PayloadCodec {
	if k == nil {
		panic("codec: NewPayloadCodec needs a key ring")
	}
	return &payloadCodec{keys: k}
}

// Encode encrypts each payload under the current key. A payload that is
// already encrypted by this codec is left as it is.
func (c *payloadCodec) Encode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	id := c.keys.Current()
	aead, _ := c.keys.aead(id)
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		if encrypted(p) {
			out[i] = p
			continue
		}
		plain, err := proto.Marshal(p)
		if err != nil {
			return payloads, fmt.Errorf("codec: serialize a payload to encrypt it: %w", err)
		}
		out[i] = &commonpb.Payload{
			Metadata: map[string][]byte{
				converter.MetadataEncoding: []byte(Encoding),
				MetadataKeyID:              []byte(id),
			},
			Data: aead.Seal(nil, nil, plain, aad(id)),
		}
	}
	return out, nil
}

// Decode decrypts the payloads this codec encrypted and passes the others
// through.
func (c *payloadCodec) Decode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		if !encrypted(p) {
			out[i] = p
			continue
		}
		decoded, err := c.decrypt(p)
		if err != nil {
			return payloads, err
		}
		out[i] = decoded
	}
	return out, nil
}

// Errors of Decode; match them with errors.Is.
var (
	// ErrUnknownKey: the payload names a key id the ring does not hold.
	ErrUnknownKey = errors.New("not in this key ring")
	// ErrUndecryptable: the ciphertext does not authenticate under the key
	// it names — altered, truncated, or encrypted with another key that
	// has the same id.
	ErrUndecryptable = errors.New("does not decrypt")
)

func (c *payloadCodec) decrypt(p *commonpb.Payload) (*commonpb.Payload, error) {
	id := string(p.GetMetadata()[MetadataKeyID])
	if !validKeyID(id) {
		return nil, fmt.Errorf("codec: an encrypted payload names no valid key id: %w", ErrUnknownKey)
	}
	aead, ok := c.keys.aead(id)
	if !ok {
		return nil, fmt.Errorf("codec: a payload is encrypted under key id %q, which is %w", id, ErrUnknownKey)
	}
	plain, err := aead.Open(nil, nil, p.GetData(), aad(id))
	if err != nil {
		return nil, fmt.Errorf("codec: a payload under key id %q %w: altered, or encrypted with another key of that id", id, ErrUndecryptable)
	}
	decoded := &commonpb.Payload{}
	if err := proto.Unmarshal(plain, decoded); err != nil {
		return nil, fmt.Errorf("codec: a payload under key id %q decrypts to no payload: %w", id, err)
	}
	return decoded, nil
}

// encrypted reports whether p carries this codec's encoding marker.
func encrypted(p *commonpb.Payload) bool {
	return string(p.GetMetadata()[converter.MetadataEncoding]) == Encoding
}

func aad(id string) []byte { return []byte(aadPrefix + id) }

// DataConverter is the SDK's default data converter with the codec of k
// applied to every payload: set it as client.Options.DataConverter on every
// client of an encrypted namespace. Nil k is the default converter
// (encryption off).
//
// It refuses plain text where it matters: a PlaintextRefuser (a workflow's
// or an Update's input) decoded from a payload that arrived unencrypted is
// told to refuse, so a worker with keys fails such a workflow, or rejects
// such an Update, as SandboxInvalidInput before it runs anything. Whoever
// can write to the namespace could otherwise start commands that no holder
// of the key ring asked for. DataConverterAllowingPlaintext does not refuse.
func DataConverter(k *Keys) converter.DataConverter {
	if k == nil {
		return converter.GetDefaultDataConverter()
	}
	return refusingConverter{DataConverterAllowingPlaintext(k)}
}

// DataConverterAllowingPlaintext is DataConverter without the refusal of
// plain-text input: for a worker whose operator allows it explicitly
// (--allow-plaintext-input, EnvAllowPlaintext), for example while the runs
// started before encryption was turned on finish.
func DataConverterAllowingPlaintext(k *Keys) converter.DataConverter {
	if k == nil {
		return converter.GetDefaultDataConverter()
	}
	return converter.NewCodecDataConverter(converter.GetDefaultDataConverter(), NewPayloadCodec(k))
}

// FailureConverter is the SDK's default failure converter over
// DataConverter(k), with failure messages and stack traces encrypted too
// (they are moved into the failure's encoded attributes); error types stay
// readable, so retry policies and workflows still match on them. Set it as
// client.Options.FailureConverter beside DataConverter. Nil k is the
// default failure converter.
func FailureConverter(k *Keys) converter.FailureConverter {
	if k == nil {
		return temporal.GetDefaultFailureConverter()
	}
	return temporal.NewDefaultFailureConverter(temporal.DefaultFailureConverterOptions{
		DataConverter:          DataConverter(k),
		EncodeCommonAttributes: true,
	})
}
