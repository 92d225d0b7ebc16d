// Package machine is the server's side of a lease machine: it starts a
// lease's init in namespaces of its own and talks to it, lays out the
// lease's root file system, gives the lease its host ids, and enforces its
// shape — a control group for memory, tasks and CPU (and the freezer that
// pauses it), a file system of its own for its disk.
//
//	sp := &machine.Spec{Hostname: id, Dir: dir, ReadOnlyPaths: paths, Owner: owner, IDRange: true, ServerRoot: root, …}
//	err := sp.MakeRoot()                                  // upper/ and work/ of each layer
//	cg, err := limiter.Create(id, machine.Limits{MemoryBytes: 1 << 30, MaxTasks: 512, VCPUs: 1})
//	spawner := machine.NewSpawner(program)                // once per server
//	m, err := machine.Start(sp, cg, spawner, nil)         // the lease init runs, its root built
//	cmdID, err := m.Spawn(leaseinit.KindExec, argv, "/workspace", env, nil, []int{stdin, stdout, stderr, status})
//	err = cg.Freeze()                                     // pause; Thaw resumes
//	m.Stop()                                              // the init, and so every process of the lease, killed
//
// What runs inside the lease — the init, the supervisor of a managed
// process, the mounts that build the root — is package leaseinit; this
// package is the only one that starts a lease init.
//
// # Where each mechanism is applied
//
//   - Namespaces (user, mount, PID, UTS, IPC, network): machine.go, Start,
//     the clone flags of the lease init, which the spawner (spawner.go;
//     leaseinit/spawner.go) clones, not the server: a clone into a new
//     user namespace copies the cloning process's page tables; its uid
//     and gid maps are Spec.idMappings (rootfs.go). The network namespace
//     is the one the server made for the lease where it can (package
//     network: Net.Namespace).
//   - Host id ranges: ids.go. A root server gives each lease IDsPerLease
//     host ids of its own (IDSlots); a fork's copy is moved into its
//     range (shiftOwners).
//   - The root file system: rootfs.go lays it out (layers: an image, or
//     the host's ReadOnlyPaths with the masks of what is not
//     world-readable, below an upper directory each), makes the
//     upper and work directories (MakeRoot), and hands the init idmapped
//     read-only clones of the lower layers (setup, idmappedClone:
//     MOUNT_ATTR_IDMAP), which the init mounts as overlays.
//   - The memory limit, the tasks limit and the CPU quota: cgroups.go,
//     Limiter.Create (memory.max or memory.limit_in_bytes without swap,
//     pids.max, a CFS quota of vcpus × 100 ms per 100 ms), through
//     github.com/containerd/cgroups/v3, v2 or v1 as the host has them.
//     Start puts the init in the group before it forks anything, so every
//     process of the lease is in it.
//   - Pause: freezer.go, Cgroup.Freeze and Thaw (cgroup.freeze or
//     freezer.state), bounded by freezeTimeout and undone when the freeze
//     does not settle.
//   - The disk: disk.go, NewDisk — a sparse image, a copy of one mkfs.ext4 per size, a loop
//     device that clears itself, mounted on the lease directory: past
//     disk_mib a write fails with ENOSPC. CheckRoom and DiskBudget keep the
//     disks together from filling the host.
//   - Fork: fork.go, CopyFiles — the upper layer, workspace and tmp of a
//     paused lease, copied with their owners, xattrs and whiteouts.
//   - Files of a lease's tree (upper layers, workspace, tmp, a fork's
//     copy): only through package hostfs, by directory descriptor, never
//     following a symlink the lease planted — MakeRoot, WriteRootFile,
//     RemoveDir, shiftOwners.
//
// A refusal for lack of room (no free id range, no disk capacity) is a
// *CapacityError, which the API answers 503.
package machine
