module github.com/sandboxflow/sandboxflow/localsandbox

go 1.26.0

// The server's module: sandboxd, the init program and the packages that
// make a lease a small machine. Users of the workflow library never load
// it, so they never download its kernel-facing dependencies. Its tests use
// the library (the client, the workflows), which lives one directory up.
replace github.com/sandboxflow/sandboxflow => ../

require (
	github.com/containerd/cgroups/v3 v3.1.3
	github.com/elastic/go-seccomp-bpf v1.6.0
	github.com/google/nftables v0.3.0
	github.com/moby/profiles/seccomp v0.3.0
	github.com/opencontainers/runtime-spec v1.3.0
	github.com/sandboxflow/sandboxflow v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.11.1
	go.temporal.io/sdk v1.50.0
	golang.org/x/net v0.58.0
	golang.org/x/sys v0.50.0
	golang.org/x/time v0.14.0
)

require (
	github.com/cilium/ebpf v0.16.0 // indirect
	github.com/containerd/log v0.1.0 // indirect
	github.com/coreos/go-systemd/v22 v22.5.0 // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/docker/go-units v0.5.0 // indirect
	github.com/facebookgo/clock v0.0.0-20150410010913-600d898af40a // indirect
	github.com/godbus/dbus/v5 v5.1.0 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/mock v1.6.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/grpc-ecosystem/go-grpc-middleware/v2 v2.3.2 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.22.0 // indirect
	github.com/mdlayher/netlink v1.7.3-0.20250113171957-fbb4dce95f42 // indirect
	github.com/mdlayher/socket v0.5.0 // indirect
	github.com/moby/sys/userns v0.1.0 // indirect
	github.com/nexus-rpc/nexus-proto-annotations v0.1.0 // indirect
	github.com/nexus-rpc/sdk-go v0.7.0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/robfig/cron v1.2.0 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/stretchr/objx v0.5.2 // indirect
	go.temporal.io/api v1.63.5 // indirect
	golang.org/x/exp v0.0.0-20241108190413-2d47ceb2692f // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/grpc v1.83.2 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
