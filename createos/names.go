package createos

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Sandbox names stand in for labels and the Idempotency-Key on a server
// that has neither, such as the hosted service (docs/CREATEOS-API.md §5), where
// a name is unique per user. A create carries the name
//
//	<prefix>--<label segment>-…-<create segment>
//
// with one label segment per label (a hash of the pair, in key order) and a
// create segment that hashes every label and the idempotency key together
// (random when the create has neither). So:
//
//   - the same LeaseSpec always gets the same name: a create whose answer
//     was lost is found again by its name, in the same call or the next;
//   - another idempotency key gets another name: a create that must make a
//     new sandbox next to a gone one does;
//   - ListLeases(labels) matches a sandbox that reports no labels when its
//     name holds the segment of every wanted pair.
//
// The hosted service documents no name rules; names are kept to a DNS label
// (at most 63 of a-z, 0-9 and '-'), which every rule seen so far accepts.
const (
	defaultNamePrefix = "sandboxflow"
	nameSeparator     = "--"
	labelSegmentLen   = 6 // base36: 31 bits per label pair
	createSegmentLen  = 8 // base36: 41 bits
	// maxLabels is how many labels fit a name after the longest prefix:
	// 16 + 2 + 5 × 7 + 8 = 61.
	maxLabels = 5
)

// createName returns the name of a create with these labels and key.
func createName(prefix string, labels map[string]string, key string) string {
	prefix = orDefault(prefix, defaultNamePrefix)
	segments := make([]string, 0, len(labels)+1)
	parts := []string{"create", key}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		segments = append(segments, labelSegment(k, labels[k]))
		parts = append(parts, k, labels[k])
	}
	if len(labels) == 0 && key == "" {
		var random [8]byte
		_, _ = rand.Read(random[:]) // never fails (crypto/rand)
		segments = append(segments, base36(random[:], createSegmentLen))
	} else {
		segments = append(segments, hashSegment(createSegmentLen, parts...))
	}
	return prefix + nameSeparator + strings.Join(segments, "-")
}

// nameCarries reports whether a name made by createName holds the segment
// of every pair of want.
func nameCarries(name string, want map[string]string) bool {
	_, rest, ok := strings.Cut(name, nameSeparator)
	if !ok {
		return false
	}
	segments := strings.Split(rest, "-")
	segments = segments[:len(segments)-1] // the create segment
	for k, v := range want {
		if !slices.Contains(segments, labelSegment(k, v)) {
			return false
		}
	}
	return true
}

func labelSegment(k, v string) string { return hashSegment(labelSegmentLen, "label", k, v) }

// hashSegment hashes parts (NUL-separated, so that no two lists of parts
// collide) into n base36 characters.
func hashSegment(n int, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return base36(sum[:8], n)
}

// base36 writes the first 8 bytes of b as exactly n base36 digits.
func base36(b []byte, n int) string {
	var mod uint64 = 1
	for range n {
		mod *= 36
	}
	s := strconv.FormatUint(binary.BigEndian.Uint64(b)%mod, 36)
	return strings.Repeat("0", n-len(s)) + s
}
