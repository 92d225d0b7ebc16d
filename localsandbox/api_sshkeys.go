package localsandbox

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"slices"
	"strings"
)

// SSH public keys (docs/CREATEOS-API.md §3.7).
//
//	POST   /v1/sandboxes/{id}/ssh-pubkeys {"keys": [...]} → {"count": n}
//	GET    /v1/sandboxes/{id}/ssh-pubkeys                 → {"keys": [...], "count": n}  [ext]
//	DELETE /v1/sandboxes/{id}/ssh-pubkeys {"keys": [...]} → {"count": n}                 [ext]
//
// and ssh_pubkeys on create and fork. The keys are checked, stored with the
// sandbox (a fork inherits them unless its request names its own), merged
// on add (a key already held, whatever its comment, is not added twice)
// and shown in the sandbox's view, as the hosted service does. Logging in
// is not served: this server has no SSH gateway; use exec or a managed
// process with a pty.

// Bounds of a sandbox's keys.
const (
	maxSSHPubkeys     = 64
	maxSSHPubkeyBytes = 16 << 10
)

// sshKeyTypes are the OpenSSH public key types accepted.
var sshKeyTypes = []string{
	"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
	"sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
}

// sshKeyID is what makes two keys the same key: its type and blob, not its
// comment.
func sshKeyID(key string) string {
	f := strings.Fields(key)
	return f[0] + " " + f[1]
}

// checkSSHPubkey checks that key is one OpenSSH public key ("type base64
// [comment]") whose blob names its type, and returns it trimmed.
func checkSSHPubkey(key string) (string, error) {
	key = strings.TrimSpace(key)
	f := strings.Fields(key)
	if len(key) > maxSSHPubkeyBytes || len(f) < 2 || !slices.Contains(sshKeyTypes, f[0]) || strings.ContainsAny(key, "\n\r\x00") {
		return "", badRequest("ssh_pubkeys: each key must be one OpenSSH public key, \"<type> <base64> [comment]\"")
	}
	blob, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil || len(blob) < 4 {
		return "", badRequest("ssh_pubkeys: a key's data is not base64")
	}
	n := binary.BigEndian.Uint32(blob)
	if uint64(n) > uint64(len(blob)-4) || !bytes.Equal(blob[4:4+n], []byte(f[0])) {
		return "", badRequest("ssh_pubkeys: a key's data does not hold a %s key", f[0])
	}
	return key, nil
}

// mergeSSHPubkeys returns held with each of add that it lacks, checked.
func mergeSSHPubkeys(held, add []string) ([]string, error) {
	out := slices.Clone(held)
	for _, k := range add {
		k, err := checkSSHPubkey(k)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(out, func(h string) bool { return sshKeyID(h) == sshKeyID(k) }) {
			out = append(out, k)
		}
	}
	if len(out) > maxSSHPubkeys {
		return nil, badRequest("a sandbox holds at most %d SSH keys", maxSSHPubkeys)
	}
	return out, nil
}

// sshPubkeysRequest is the body of POST and DELETE /ssh-pubkeys.
type sshPubkeysRequest struct {
	Keys []string `json:"keys"`
}

func (s *Server) addSSHPubkeys(w http.ResponseWriter, r *http.Request) error {
	return s.changeSSHPubkeys(w, r, mergeSSHPubkeys)
}

func (s *Server) deleteSSHPubkeys(w http.ResponseWriter, r *http.Request) error {
	return s.changeSSHPubkeys(w, r, func(held, keys []string) ([]string, error) {
		drop := map[string]bool{}
		for _, k := range keys {
			k, err := checkSSHPubkey(k)
			if err != nil {
				return nil, err
			}
			drop[sshKeyID(k)] = true
		}
		return slices.DeleteFunc(slices.Clone(held), func(h string) bool { return drop[sshKeyID(h)] }), nil
	})
}

// changeSSHPubkeys applies change to the sandbox's keys and the request's,
// and answers how many it holds after.
func (s *Server) changeSSHPubkeys(w http.ResponseWriter, r *http.Request, change func(held, keys []string) ([]string, error)) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	var req sshPubkeysRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if len(req.Keys) == 0 {
		return badRequest("keys must name at least one key")
	}
	if len(req.Keys) > maxSSHPubkeys {
		return badRequest("a sandbox holds at most %d SSH keys", maxSSHPubkeys)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	keys, err := change(l.sshPubkeys, req.Keys)
	if err != nil {
		return err
	}
	l.sshPubkeys = keys
	return writeData(w, map[string]int{"count": len(keys)})
}

func (s *Server) listSSHPubkeys(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	l.mu.Lock()
	keys := slices.Clone(l.sshPubkeys)
	l.mu.Unlock()
	if keys == nil {
		keys = []string{}
	}
	return writeData(w, map[string]any{"keys": keys, "count": len(keys)})
}
