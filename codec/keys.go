package codec

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Environment variables that LoadKeys reads.
const (
	// EnvKeys holds a key ring spec: "id1:BASE64KEY,id2:BASE64KEY".
	EnvKeys = "SANDBOXFLOW_CODEC_KEYS"
	// EnvKeysFile names a file that holds a key ring spec, so that the keys
	// need not be in the process environment.
	EnvKeysFile = "SANDBOXFLOW_CODEC_KEYS_FILE"
)

// KeySize is the size of an AES-256 key in bytes.
const KeySize = 32

// maxKeyIDLen bounds a key id: it travels in the metadata of every payload.
const maxKeyIDLen = 64

// Keys is a key ring: the key that encrypts new payloads (the current key)
// and every key that may still have to decrypt old ones, by id.
//
// Rotation is adding a key in front: the new first key encrypts from then
// on, and payloads written under an older id keep decrypting for as long as
// that id stays in the ring. A payload names the id it was encrypted with,
// never the key. Drop an old id only once no history that it encrypted is
// still needed (retention, or reset workflows).
//
// Keys never prints its key material: its String form names the ids only.
// A Keys is safe for concurrent use and immutable once made.
type Keys struct {
	current string
	ids     []string               // in spec order, current first
	aeads   map[string]cipher.AEAD // AES-256-GCM with random nonces, by id
}

// ParseKeys parses a key ring spec: comma-separated entries ID:BASE64KEY,
// the first being the current key. Each key is 32 bytes of standard base64
// (padded or not); each id is 1–64 characters of A–Z a–z 0–9 . _ - and
// appears once. Spaces and newlines around entries are ignored, so a spec
// may be the content of a file.
//
// Errors say which entry is wrong and why, by position or id, but never
// repeat what was written: a malformed entry might be a key.
func ParseKeys(spec string) (*Keys, error) {
	k := &Keys{aeads: map[string]cipher.AEAD{}}
	entries := strings.Split(strings.TrimSpace(spec), ",")
	for i, entry := range entries {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			if len(entries) == 1 {
				return nil, errors.New("codec: the key ring spec is empty (want ID:BASE64KEY[,ID:BASE64KEY…])")
			}
			return nil, fmt.Errorf("codec: key ring entry %d is empty", i+1)
		}
		id, encoded, ok := strings.Cut(entry, ":")
		if !ok {
			return nil, fmt.Errorf("codec: key ring entry %d is not ID:BASE64KEY", i+1)
		}
		if !validKeyID(id) {
			return nil, fmt.Errorf("codec: key ring entry %d: the key id must be 1 to %d characters of A-Z a-z 0-9 . _ -", i+1, maxKeyIDLen)
		}
		if _, dup := k.aeads[id]; dup {
			return nil, fmt.Errorf("codec: key id %q appears twice in the key ring", id)
		}
		key, err := decodeKey(encoded)
		if err != nil {
			return nil, fmt.Errorf("codec: key %q: %w", id, err)
		}
		if err := k.add(id, key); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// LoadKeys reads the key ring from the environment: EnvKeys holds the spec
// (see ParseKeys), or EnvKeysFile names a file holding it. With neither set
// it returns (nil, nil): encryption is off. Both set is an error, since
// either could be the stale one.
func LoadKeys(getenv func(string) string) (*Keys, error) {
	spec, file := getenv(EnvKeys), getenv(EnvKeysFile)
	switch {
	case spec != "" && file != "":
		return nil, fmt.Errorf("codec: both %s and %s are set; set one", EnvKeys, EnvKeysFile)
	case file != "":
		content, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("codec: %s: %w", EnvKeysFile, err)
		}
		keys, err := ParseKeys(string(content))
		if err != nil {
			return nil, fmt.Errorf("%w (in %s)", err, file)
		}
		return keys, nil
	case spec != "":
		keys, err := ParseKeys(spec)
		if err != nil {
			return nil, fmt.Errorf("%w (in %s)", err, EnvKeys)
		}
		return keys, nil
	}
	return nil, nil
}

// GenerateKeys makes a key ring of one fresh random key under id: for
// development and tests. The key exists only in this process: whatever it
// encrypts cannot be read once the process is gone.
func GenerateKeys(id string) (*Keys, error) {
	if !validKeyID(id) {
		return nil, fmt.Errorf("codec: the key id must be 1 to %d characters of A-Z a-z 0-9 . _ -", maxKeyIDLen)
	}
	key := make([]byte, KeySize)
	rand.Read(key) // never fails (crypto/rand)
	k := &Keys{aeads: map[string]cipher.AEAD{}}
	if err := k.add(id, key); err != nil {
		return nil, err
	}
	return k, nil
}

// Rotate returns a new ring whose current key is a fresh random key under
// id, keeping every key of k for decryption. k itself is unchanged.
func (k *Keys) Rotate(id string) (*Keys, error) {
	fresh, err := GenerateKeys(id)
	if err != nil {
		return nil, err
	}
	if _, dup := k.aeads[id]; dup {
		return nil, fmt.Errorf("codec: key id %q is already in the key ring", id)
	}
	for _, old := range k.ids {
		fresh.ids = append(fresh.ids, old)
		fresh.aeads[old] = k.aeads[old]
	}
	return fresh, nil
}

// Current is the id of the key that encrypts new payloads.
func (k *Keys) Current() string { return k.current }

// IDs are the ids of every key in the ring, the current one first.
func (k *Keys) IDs() []string { return slices.Clone(k.ids) }

// String names the ring's ids, never its keys.
func (k *Keys) String() string {
	if k == nil {
		return "codec.Keys(none)"
	}
	return fmt.Sprintf("codec.Keys(current %s; ids %s)", k.current, strings.Join(k.ids, ","))
}

// GoString is String, so that %#v does not print the ring's internals.
func (k *Keys) GoString() string { return k.String() }

// aead returns the cipher of key id.
func (k *Keys) aead(id string) (cipher.AEAD, bool) {
	a, ok := k.aeads[id]
	return a, ok
}

// add puts a key in the ring; the first key added is the current one.
func (k *Keys) add(id string, key []byte) error {
	block, err := aes.NewCipher(key)
	if err != nil {
		return fmt.Errorf("codec: key %q: %w", id, err)
	}
	a, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return fmt.Errorf("codec: key %q: %w", id, err)
	}
	if k.current == "" {
		k.current = id
	}
	k.ids = append(k.ids, id)
	k.aeads[id] = a
	return nil
}

// decodeKey decodes a base64 key and checks its size. Its errors never
// include the input.
func decodeKey(encoded string) ([]byte, error) {
	encoded = strings.TrimSpace(encoded)
	key, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		key, err = base64.RawStdEncoding.DecodeString(encoded)
	}
	if err != nil {
		return nil, errors.New("the key is not valid standard base64")
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("the key is %d bytes; AES-256 needs %d", len(key), KeySize)
	}
	return key, nil
}

// validKeyID reports whether id may name a key: it is written into payload
// metadata and error texts, so it is short and plain.
func validKeyID(id string) bool {
	if id == "" || len(id) > maxKeyIDLen {
		return false
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}
