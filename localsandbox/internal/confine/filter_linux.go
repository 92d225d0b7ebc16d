package confine

import (
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	dockerseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp filter is Docker's default profile (an allow-list: anything
// not named returns EPERM), resolved for the capabilities this package
// keeps, with these changes:
//
//   - the syscalls in tightened are removed from the allow-list (Docker
//     allows them; issue 14 does not);
//   - ioctl(TIOCSTI) and ioctl(TIOCLINUX) are refused, whatever the upper
//     32 bits of the request word hold;
//   - with Policy.AllowNestedUserNS, unshare, setns and clone/clone3 with any
//     flags are allowed.

// tightened are syscalls Docker's default profile allows that this package
// refuses.
var tightened = []string{
	// ptrace and its cousins read and write another process's memory; in a
	// pid namespace the obvious target is the init, which holds the server's
	// descriptors. Docker allows them on kernels >= 4.8 (seccomp can no
	// longer be bypassed through ptrace there); debuggers inside a lease
	// therefore do not work.
	"ptrace", "process_vm_readv", "process_vm_writev",
	// modify_ldt: a long record of kernel bugs, needed only by 16-bit code
	// and wine.
	"modify_ldt",
	// name_to_handle_at pairs with open_by_handle_at (the "shocker" escape;
	// refused by Docker unless CAP_DAC_READ_SEARCH), and has no ordinary use.
	"name_to_handle_at",
	// Reading the kernel clock discipline is harmless, but setting it is what
	// these calls are for; CAP_SYS_TIME is dropped as well.
	"adjtimex", "clock_adjtime",
}

// refusedIoctls are ioctl requests refused whatever the terminal: TIOCSTI
// pushes bytes into a terminal's input queue (a confined process typing
// commands into a shell outside it), TIOCLINUX reaches the virtual console
// (including its selection buffer, which can be pasted as input).
var refusedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX}

// dockerCapabilityNames are the names of keptCapabilities as Docker's
// profile spells them; the profile includes or excludes rules by them.
func dockerCapabilityNames() []string {
	names := make([]string, 0, len(keptCapabilities))
	for _, c := range keptCapabilities {
		names = append(names, c.name)
	}
	return names
}

// The filter is a stack of seccomp programs, each built by the library:
// the kernel runs every one on every syscall and the most restrictive
// verdict wins. The first is the allow-list of syscall numbers (default
// EPERM); each of the others restricts the arguments of one syscall and
// allows everything else. One syscall per program is not a style choice:
// the library's argument checks load the argument into BPF's accumulator
// and a failed check falls through to the next syscall comparison without
// reloading the syscall number, so a conditional rule is only sound as the
// last rule of its program.

// filters builds the seccomp policies Apply installs for p, in the order
// it installs them.
func filters(p Policy) ([]seccomp.Policy, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, err
	}
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: dockerCapabilityNames(),
	}}}
	docker, err := dockerseccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("resolve Docker's default profile: %w", err)
	}
	if docker.DefaultAction != specs.ActErrno {
		return nil, fmt.Errorf("docker's default profile has default action %q, want %q", docker.DefaultAction, specs.ActErrno)
	}

	skip := map[string]bool{}
	for _, name := range tightened {
		skip[name] = true
	}
	allow := seccomp.SyscallGroup{Action: seccomp.ActionAllow}
	var errnoGroups []seccomp.SyscallGroup
	if p.AllowNestedUserNS {
		allow.Names = append(allow.Names, "unshare", "setns", "clone", "clone3")
		for _, name := range allow.Names {
			skip[name] = true
		}
	}
	allowed := map[string]bool{}
	// restricted: per syscall Docker allows only with some arguments, the
	// conditions (one per rule, any of which allows the call).
	restricted := map[string][]seccomp.Condition{}
	var restrictedOrder []string
	for _, rule := range docker.Syscalls {
		action, err := actionFromDocker(rule)
		if err != nil {
			return nil, err
		}
		names := knownNames(rule.Names, info, skip)
		switch {
		case len(names) == 0:
		case len(rule.Args) == 0 && action == seccomp.ActionAllow:
			allow.Names = append(allow.Names, names...)
			for _, name := range names {
				allowed[name] = true
			}
		case len(rule.Args) == 0:
			errnoGroups = append(errnoGroups, seccomp.SyscallGroup{Action: action, Names: names})
		case action == seccomp.ActionAllow && len(rule.Args) == 1:
			c, err := conditionFromDocker(rule.Args[0])
			if err != nil {
				return nil, fmt.Errorf("docker's profile rule for %v: %w", rule.Names, err)
			}
			for _, name := range names {
				if _, seen := restricted[name]; !seen {
					restrictedOrder = append(restrictedOrder, name)
				}
				restricted[name] = append(restricted[name], c)
			}
		default:
			return nil, fmt.Errorf("docker's profile rule for %v (%s on %d arguments) is not translated", rule.Names, rule.Action, len(rule.Args))
		}
	}

	policies := []seccomp.Policy{{
		DefaultAction: seccomp.ActionErrno,
		Syscalls:      append([]seccomp.SyscallGroup{allow}, errnoGroups...),
	}}
	for _, name := range restrictedOrder {
		if allowed[name] {
			continue // also allowed whatever its arguments
		}
		allow.Names = append(allow.Names, name)
		policies = append(policies, refuseUnless(name, restricted[name]))
	}
	policies[0].Syscalls[0] = allow
	policies = append(policies, refuseIoctls())
	return policies, nil
}

// programs assembles filters(p) into the BPF programs the kernel runs, arch
// check included, in installation order.
func programs(p Policy) ([][]bpf.Instruction, error) {
	pols, err := filters(p)
	if err != nil {
		return nil, err
	}
	progs := make([][]bpf.Instruction, 0, len(pols))
	for _, pol := range pols {
		prog, err := pol.Assemble()
		if err != nil {
			return nil, err
		}
		progs = append(progs, prog)
	}
	return progs, nil
}

// refuseUnless is the program that refuses name with EPERM unless one of
// allowIf holds, and allows every other syscall: "none holds" is the
// conjunction of their negations, one condition set.
func refuseUnless(name string, allowIf []seccomp.Condition) seccomp.Policy {
	var refuseIf seccomp.ArgumentConditions
	for _, c := range allowIf {
		c.Operation = negations[c.Operation]
		refuseIf = append(refuseIf, c)
	}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{{
			Action:             seccomp.ActionErrno,
			NamesWithCondtions: []seccomp.NameWithConditions{{Name: name, Conditions: refuseIf}},
		}},
	}
}

// negations maps each comparison to its opposite.
var negations = map[seccomp.Operation]seccomp.Operation{
	seccomp.Equal:          seccomp.NotEqual,
	seccomp.NotEqual:       seccomp.Equal,
	seccomp.LessThan:       seccomp.GreaterOrEqual,
	seccomp.GreaterOrEqual: seccomp.LessThan,
	seccomp.GreaterThan:    seccomp.LessOrEqual,
	seccomp.LessOrEqual:    seccomp.GreaterThan,
	seccomp.BitsNotSet:     seccomp.BitsSet,
	seccomp.BitsSet:        seccomp.BitsNotSet,
}

// refuseIoctls is the program that refuses refusedIoctls with EPERM and
// allows everything else.
//
// The kernel reads ioctl's request as a 32-bit unsigned int, but seccomp
// sees the whole 64-bit register, so comparing all 64 bits would let a
// caller pass TIOCSTI with junk in the upper half. The library compares 64
// bits, so equality of the low half alone is spelled as: no bit outside
// the request is set in the low half (BitsNotSet with a zero high word
// ignores the high half), and each bit of the request is set.
func refuseIoctls() seccomp.Policy {
	g := seccomp.SyscallGroup{Action: seccomp.ActionErrno}
	for _, req := range refusedIoctls {
		conds := seccomp.ArgumentConditions{
			{Argument: 1, Operation: seccomp.BitsNotSet, Value: uint64(^req)},
		}
		for bit := uint32(1); bit != 0; bit <<= 1 {
			if req&bit != 0 {
				conds = append(conds, seccomp.Condition{Argument: 1, Operation: seccomp.BitsSet, Value: uint64(bit)})
			}
		}
		g.NamesWithCondtions = append(g.NamesWithCondtions, seccomp.NameWithConditions{Name: "ioctl", Conditions: conds})
	}
	return seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: []seccomp.SyscallGroup{g}}
}

// actionFromDocker translates a rule's action.
func actionFromDocker(rule specs.LinuxSyscall) (seccomp.Action, error) {
	switch rule.Action {
	case specs.ActAllow:
		return seccomp.ActionAllow, nil
	case specs.ActErrno:
		errno := uint32(unix.EPERM)
		if rule.ErrnoRet != nil {
			errno = uint32(*rule.ErrnoRet)
		}
		return seccomp.ActionErrno | seccomp.Action(errno), nil
	}
	return 0, fmt.Errorf("docker's profile rule for %v has action %q, which this package does not translate", rule.Names, rule.Action)
}

// knownNames are the names the running architecture has (Docker's profile
// also names chown32 and the like), less those in skip.
func knownNames(names []string, info *arch.Info, skip map[string]bool) []string {
	var out []string
	for _, name := range names {
		if _, ok := info.SyscallNames[name]; ok && !skip[name] {
			out = append(out, name)
		}
	}
	return out
}

// conditionFromDocker translates one argument comparison.
func conditionFromDocker(a specs.LinuxSeccompArg) (seccomp.Condition, error) {
	c := seccomp.Condition{Argument: uint32(a.Index), Value: a.Value}
	switch a.Op {
	case specs.OpEqualTo:
		c.Operation = seccomp.Equal
	case specs.OpNotEqual:
		c.Operation = seccomp.NotEqual
	case specs.OpLessThan:
		c.Operation = seccomp.LessThan
	case specs.OpLessEqual:
		c.Operation = seccomp.LessOrEqual
	case specs.OpGreaterThan:
		c.Operation = seccomp.GreaterThan
	case specs.OpGreaterEqual:
		c.Operation = seccomp.GreaterOrEqual
	case specs.OpMaskedEqual:
		// (arg & Value) == ValueTwo; Docker uses it only with ValueTwo 0
		// ("none of these flags"), which is BitsNotSet.
		if a.ValueTwo != 0 {
			return c, fmt.Errorf("a masked compare with a non-zero result is not translated")
		}
		c.Operation = seccomp.BitsNotSet
	default:
		return c, fmt.Errorf("comparison %q is not translated", a.Op)
	}
	return c, nil
}
