package localsandbox

import "math"

// shape is a machine size of the hosted service. The local server accepts
// every hosted shape so that the same configuration works against both;
// where it can (root, cgroups) the kernel enforces a shape's CPU and memory
// per lease (cgroups.go), and the view says where it does not.
type shape struct {
	Name        string  `json:"name"`
	VCPUs       float64 `json:"vcpus"`
	MemoryBytes int64   `json:"memory_bytes"`
}

// vcpu is the shape's whole vCPUs, as the API counts them: a shape of less
// than one is one vCPU under a CPU quota.
func (sh shape) vcpu() int { return int(math.Ceil(sh.VCPUs)) }

const mib = 1 << 20

// shapes are the hosted service's shapes, in its order.
var shapes = []shape{
	{"s-1vcpu-256mb", 1, 256 * mib},
	{"s-0.25vcpu-512mb", 0.25, 512 * mib},
	{"s-0.5vcpu-1gb", 0.5, 1024 * mib},
	{"s-1vcpu-1gb", 1, 1024 * mib},
	{"s-1vcpu-2gb", 1, 2048 * mib},
	{"s-2vcpu-2gb", 2, 2048 * mib},
	{"s-2vcpu-4gb", 2, 4096 * mib},
	{"s-4vcpu-4gb", 4, 4096 * mib},
	{"s-4vcpu-8gb", 4, 8192 * mib},
	{"s-8vcpu-8gb", 8, 8192 * mib},
	{"s-8vcpu-16gb", 8, 16384 * mib},
}

// defaultShape is the shape of a sandbox created without one.
const defaultShape = "s-1vcpu-1gb"

func lookupShape(name string) (shape, bool) {
	if name == "" {
		name = defaultShape
	}
	for _, s := range shapes {
		if s.Name == name {
			return s, true
		}
	}
	return shape{}, false
}
