package localsandbox

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// Two test keys (public halves only), and the first with another comment.
const (
	sshKeyOne      = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKKAMadsz89A1JchvIhouTeibWdAaWwd4uuGxi1NgW4l one@test"
	sshKeyOneAgain = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKKAMadsz89A1JchvIhouTeibWdAaWwd4uuGxi1NgW4l the same key"
	sshKeyTwo      = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAfcyDaMzsUzsJzCstXP6F9Vf9AMQsKFEtrdlORqQ2Rk two@test"
)

// SSH keys are checked and stored: given at create, added (merged),
// listed, deleted, shown in the view and inherited by a fork unless it
// names its own. Before, ssh_pubkeys at create was 400 UNSUPPORTED and the
// route a 404.
func TestSSHPubkeysAreStored(t *testing.T) {
	ts := startServer(t, Options{})
	var sb struct {
		ID         string   `json:"id"`
		SSHPubkeys []string `json:"ssh_pubkeys"`
	}
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "ssh_pubkeys": []string{sshKeyOne}}, &sb)
	if !slices.Equal(sb.SSHPubkeys, []string{sshKeyOne}) {
		t.Errorf("create answered keys %q", sb.SSHPubkeys)
	}
	keys := "/sandboxes/" + sb.ID + "/ssh-pubkeys"
	var count struct{ Count int }
	ts.mustCall("POST", keys, map[string]any{"keys": []string{sshKeyOneAgain, sshKeyTwo, " " + sshKeyTwo + "\t"}}, &count)
	if count.Count != 2 {
		t.Errorf("after adding a held key and a new one twice: count %d, want 2", count.Count)
	}
	var list struct {
		Keys  []string
		Count int
	}
	ts.mustCall("GET", keys, nil, &list)
	if !slices.Equal(list.Keys, []string{sshKeyOne, sshKeyTwo}) || list.Count != 2 {
		t.Errorf("list: %+v", list)
	}
	for _, bad := range [][]string{{"ssh-ed25519 AAAA"}, {"ssh-dss AAAAB3NzaC1kc3MAAACBAP"}, {"not a key"},
		{"ssh-rsa " + strings.Split(sshKeyOne, " ")[1]}, {sshKeyOne + "\nssh-ed25519 x"}, {}} {
		if status, body := ts.rawCall("POST", keys, map[string]any{"keys": bad}); status != http.StatusBadRequest {
			t.Errorf("POST %q: %d %s, want 400", bad, status, body)
		}
	}
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/pause", nil, nil)
	waitStatus(t, ts, sb.ID, "paused")
	var inherited, own struct {
		ID         string   `json:"id"`
		SSHPubkeys []string `json:"ssh_pubkeys"`
	}
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/fork", nil, &inherited)
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/fork", map[string]any{"ssh_pubkeys": []string{sshKeyTwo}}, &own)
	if !slices.Equal(inherited.SSHPubkeys, []string{sshKeyOne, sshKeyTwo}) || !slices.Equal(own.SSHPubkeys, []string{sshKeyTwo}) {
		t.Errorf("forks hold %q and %q", inherited.SSHPubkeys, own.SSHPubkeys)
	}
	if status, _ := ts.rawCall("POST", "/sandboxes/"+sb.ID+"/fork", map[string]any{"ssh_pubkeys": []string{"ssh-ed25519 AAAA"}}); status != http.StatusBadRequest {
		t.Errorf("fork with a bad key: %d, want 400", status)
	}
	ts.mustCall("DELETE", keys, map[string]any{"keys": []string{sshKeyOneAgain}}, &count)
	ts.mustCall("GET", "/sandboxes/"+sb.ID, nil, &sb)
	if count.Count != 1 || !slices.Equal(sb.SSHPubkeys, []string{sshKeyTwo}) {
		t.Errorf("after deleting the first key: count %d, view %q", count.Count, sb.SSHPubkeys)
	}
	waitStatus(t, ts, inherited.ID, "running")
	waitStatus(t, ts, own.ID, "running")
}
