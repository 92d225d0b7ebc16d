// Command fleet demonstrates a fleet of sandbox hosts on one machine
// (make fleet): an embedded Temporal server, and three hosts, each a
// sandboxd process with its own root and port and a worker process in host
// mode (bin/sandboxd, bin/worker --host). It runs 60 commands and counts
// them per host, then SIGKILLs both processes of one host while it runs
// commands, and shows what became of them: every run completes or fails
// typed, those on the dead host run again on another (once per fresh
// lease, by their workflow histories), nothing is left on the other hosts,
// and once the host is back its sandboxd and its worker's sweep leave
// nothing behind either.
//
//	make build && cd devserver && go run ./cmd/fleet -bin ../bin
//
// It also says what the runs cost where: the CPU time of each host's
// processes (worker, sandboxd and the sandboxes it ran) and of this
// process (the Temporal server) per run. With -lease-cost N it measures
// instead what an idle lease costs a host: N leases made on one sandboxd,
// their memory (PSS of sandboxd and every sandbox process) and disk.
//
// The exit status is 1 when any of that does not hold.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/bench"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/runresult"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

func main() {
	bin := flag.String("bin", "../bin", "directory of the sandboxd and worker binaries (make build)")
	hosts := flag.Int("hosts", 3, "sandbox hosts")
	capacity := flag.Int("host-capacity", 4, "leases each host holds at most")
	runs := flag.Int("runs", 60, "commands of the placement round")
	concurrency := flag.Int("concurrency", 8, "commands at once")
	leaseCost := flag.Int("lease-cost", 0, "measure what N idle leases cost one host, instead of the demo")
	flag.Parse()
	d := &demo{bin: *bin, capacity: *capacity, failed: func(format string, args ...any) {
		fmt.Printf("FAILED: "+format+"\n", args...)
		failures++
	}}
	run := func(ctx context.Context) error { return d.run(ctx, *hosts, *runs, *concurrency) }
	if *leaseCost > 0 {
		run = func(ctx context.Context) error { return d.measureLeases(ctx, *leaseCost) }
	}
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(2)
	}
	if failures > 0 {
		os.Exit(1)
	}
}

var failures int

// hostStart and heartbeat are the runs' short waits for a host and for a
// command's heartbeats: a dead host is found out within their sum.
const (
	hostStart = 10 * time.Second
	heartbeat = 10 * time.Second
)

type demo struct {
	bin      string
	capacity int
	dir      string
	stack    *stack.Stack
	hosts    []*host
	failed   func(format string, args ...any)
}

// host is a sandbox host of the demo: a sandboxd process and a worker
// process.
type host struct {
	name, root, listen, key string
	sandboxd, worker        *exec.Cmd
	provider                *createos.Client
}

func (d *demo) run(ctx context.Context, nHosts, runs, concurrency int) error {
	for _, b := range []string{"sandboxd", "worker"} {
		if _, err := os.Stat(filepath.Join(d.bin, b)); err != nil {
			return fmt.Errorf("%w (make build)", err)
		}
	}
	var err error
	if d.dir, err = os.MkdirTemp("", "sandboxflow-fleet-"); err != nil {
		return err
	}
	defer os.RemoveAll(d.dir)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	d.stack, err = stack.Start(ctx, stack.Options{
		Temporal:  temporalserver.Options{Logger: logger, LogLevel: slog.LevelError},
		NoSandbox: true, NoWorker: true, Logger: logger,
	})
	if err != nil {
		return err
	}
	defer d.stack.Stop()
	fmt.Printf("Temporal %s, Web UI %s\n", d.stack.Temporal.FrontendHostPort(), d.stack.Temporal.UIURL())
	defer d.stopHosts()
	for i := range nHosts {
		h, err := d.startHost(ctx, fmt.Sprintf("host-%c", 'a'+i))
		if err != nil {
			return err
		}
		d.hosts = append(d.hosts, h)
	}
	fmt.Printf("%d hosts of %d leases each: %s\n\n", nHosts, d.capacity, strings.Join(d.names(), ", "))

	// 1. Placement.
	fmt.Printf("## 1. %d runs, %d at a time\n\n", runs, concurrency)
	began, cpuBefore := time.Now(), d.cpu()
	placed := d.runAll(ctx, runs, concurrency, "true")
	d.checkClean(ctx, d.hosts) // every sandbox process reaped: its CPU time is counted
	elapsed, cpuAfter := time.Since(began), d.cpu()
	fmt.Printf("%d runs in %s\n\n", runs, elapsed.Round(100*time.Millisecond))
	d.report(ctx, placed)
	d.reportCPU(cpuBefore, cpuAfter, runs)

	// 2. A host killed mid-run.
	held := d.capacity*len(d.hosts) - 2 // more than the others can hold
	fmt.Printf("\n## 2. %d runs of `sleep 8`; the busiest host is SIGKILLed once they run\n\n", held)
	started := make([]*run, held)
	for i := range started {
		started[i] = d.start(ctx, "sleep 8")
	}
	victim, err := d.busiest(ctx, started)
	if err != nil {
		return err
	}
	fmt.Printf("SIGKILL %s (sandboxd pid %d, worker pid %d)\n\n", victim.name, victim.sandboxd.Process.Pid, victim.worker.Process.Pid)
	victim.kill()
	var wg sync.WaitGroup
	for _, r := range started {
		wg.Go(func() { d.wait(ctx, r) })
	}
	wg.Wait()
	d.report(ctx, started)
	moved := 0
	for _, r := range started {
		if r.err == nil && r.res.LeaseHost == victim.name {
			d.failed("run %s ended on the dead host", r.id)
		}
		if r.err == nil && len(r.res.LostLeases) > 0 {
			moved++
		}
	}
	fmt.Printf("\n%d runs gave their lease up with %s and ran again on another host\n", moved, victim.name)
	if moved == 0 {
		d.failed("no run was on the dead host")
	}
	var survivors []*host
	for _, h := range d.hosts {
		if h != victim {
			survivors = append(survivors, h)
		}
	}
	d.checkClean(ctx, survivors)

	// The host comes back.
	fmt.Printf("\n%s returns: its sandboxd clears what its killed predecessor left (of a host whose sandboxd outlived its worker, the worker's sweep destroys what no workflow holds)\n", victim.name)
	if err := victim.startProcesses(d); err != nil {
		return err
	}
	d.checkClean(ctx, d.hosts)
	if failures == 0 {
		fmt.Println("\nAll good.")
	}
	return nil
}

func (d *demo) names() []string {
	var out []string
	for _, h := range d.hosts {
		out = append(out, h.name)
	}
	return out
}

// startHost starts a host's sandboxd and worker.
func (d *demo) startHost(ctx context.Context, name string) (*host, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	h := &host{name: name, root: filepath.Join(d.dir, name), listen: "127.0.0.1:" + strconv.Itoa(port), key: rand.Text()}
	if err := os.MkdirAll(h.root, 0o711); err != nil {
		return nil, err
	}
	if h.provider, err = createos.New(createos.Config{BaseURL: "http://" + h.listen, APIKey: h.key}); err != nil {
		return nil, err
	}
	return h, h.startProcesses(d)
}

// startProcesses starts the host's sandboxd, waits until it answers, then
// starts its worker.
func (h *host) startProcesses(d *demo) error {
	if err := h.startSandboxd(d); err != nil {
		return err
	}
	logs, err := h.logs(d)
	if err != nil {
		return err
	}
	h.worker = exec.Command(filepath.Join(d.bin, "worker"), "--host", h.name, "--host-capacity", strconv.Itoa(d.capacity),
		"--sandbox-url", "http://"+h.listen, "--metrics-listen", "", "--log-level", "warn", "--stop-timeout", "0s")
	h.worker.Env = append(os.Environ(), "SANDBOX_API_KEY="+h.key,
		"TEMPORAL_ADDRESS="+d.stack.Temporal.FrontendHostPort(), "TEMPORAL_NAMESPACE="+d.stack.Temporal.Namespace(),
		"HOME="+h.root) // no Temporal profile of this machine's user
	h.worker.Stdout, h.worker.Stderr = logs, logs
	return h.worker.Start()
}

func (h *host) logs(d *demo) (*os.File, error) {
	return os.OpenFile(filepath.Join(d.dir, h.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
}

// startSandboxd starts the host's sandboxd and waits until it answers.
func (h *host) startSandboxd(d *demo) error {
	logs, err := h.logs(d)
	if err != nil {
		return err
	}
	h.sandboxd = exec.Command(filepath.Join(d.bin, "sandboxd"), "--listen", h.listen, "--root", filepath.Join(h.root, "sandbox"), "--log-level", "warn")
	h.sandboxd.Env = append(os.Environ(), "SANDBOXD_API_KEY="+h.key)
	h.sandboxd.Stdout, h.sandboxd.Stderr = logs, logs
	if err := h.sandboxd.Start(); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := h.provider.ListLeases(ctx, nil)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: sandboxd does not answer: %w (log: %s)", h.name, err, logs.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// kill SIGKILLs the host's processes, the worker first.
func (h *host) kill() {
	for _, c := range []*exec.Cmd{h.worker, h.sandboxd} {
		c.Process.Signal(syscall.SIGKILL)
		c.Wait()
	}
}

// stopHosts stops every host: SIGTERM, so that sandboxd kills its leases'
// processes and removes their workspaces.
func (d *demo) stopHosts() {
	for _, h := range d.hosts {
		for _, c := range []*exec.Cmd{h.worker, h.sandboxd} {
			if c != nil && c.ProcessState == nil {
				c.Process.Signal(syscall.SIGTERM)
				c.Wait()
			}
		}
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// run is one RunCommand of the demo.
type run struct {
	id  string
	wf  client.WorkflowRun
	res workflows.Result
	err error
}

// options are the runs' activity options: a dead host is found out within
// heartbeat + hostStart.
func options() *workflows.ActivityOverrides {
	onHost := func(o workflows.ActivityOptions) *workflows.ActivityOptions {
		o.ScheduleToStartTimeout = hostStart
		return &o
	}
	return &workflows.ActivityOverrides{
		Execute:      onHost(workflows.ActivityOptions{HeartbeatTimeout: heartbeat}),
		DestroyLease: onHost(workflows.ActivityOptions{}),
	}
}

func (d *demo) start(ctx context.Context, script string) *run {
	r := &run{id: "fleet-" + strings.ToLower(rand.Text()[:10])}
	r.wf, r.err = d.stack.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: r.id, TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, workflows.Request{Command: sandbox.Command{Argv: []string{"sh", "-c", script}}, ActivityOptions: options()})
	return r
}

func (d *demo) wait(ctx context.Context, r *run) {
	if r.err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	_, r.err = runresult.Get(ctx, d.stack.Client, r.wf, &r.res)
}

func (d *demo) runAll(ctx context.Context, n, concurrency int, script string) []*run {
	out := make([]*run, n)
	slots := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i := range out {
		slots <- struct{}{}
		out[i] = d.start(ctx, script)
		wg.Go(func() {
			defer func() { <-slots }()
			d.wait(ctx, out[i])
		})
	}
	wg.Wait()
	return out
}

// busiest waits until every run's command runs, then returns the host
// that runs most of them.
func (d *demo) busiest(ctx context.Context, runs []*run) (*host, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		per := map[string]int{}
		running := 0
		for _, r := range runs {
			if r.err != nil {
				continue
			}
			var state workflows.State
			if v, err := d.stack.Client.QueryWorkflow(ctx, r.id, "", workflows.StateQuery); err == nil && v.Get(&state) == nil && state.Phase == workflows.PhaseExecuting {
				running++
				per[state.LeaseHost]++
			}
		}
		if running == len(runs) || time.Now().After(deadline) {
			best := d.hosts[0]
			for _, h := range d.hosts {
				if per[h.name] > per[best.name] {
					best = h
				}
			}
			fmt.Printf("running: %v\n", per)
			return best, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// report prints the runs' outcomes: per host, typed failures, and each
// run's Execute activities against its fresh leases.
func (d *demo) report(ctx context.Context, runs []*run) {
	perHost, typed := map[string]int{}, map[string]int{}
	fresh := 0
	for _, r := range runs {
		if r.err != nil {
			var appErr *temporal.ApplicationError
			if errors.As(r.err, &appErr) {
				typed[appErr.Type()]++
			} else {
				d.failed("run %s failed untyped: %v", r.id, r.err)
			}
			continue
		}
		perHost[r.res.LeaseHost]++
		fresh += r.res.FreshLeases
		if n, err := d.executes(ctx, r); err != nil {
			d.failed("history of %s: %v", r.id, err)
		} else if n != 1+r.res.FreshLeases {
			d.failed("run %s ran its command %d times on %d leases", r.id, n, 1+r.res.FreshLeases)
		}
	}
	fmt.Println("| host | runs |")
	fmt.Println("|---|---:|")
	for _, name := range d.names() {
		fmt.Printf("| %s | %d |\n", name, perHost[name])
	}
	fmt.Printf("\nfresh leases: %d; typed failures: %v\n", fresh, typed)
}

// executes counts the Execute activities of a run: one per lease it ran
// the command on (an activity's retries re-attach to the same process).
func (d *demo) executes(ctx context.Context, r *run) (int, error) {
	n := 0
	it := d.stack.Client.GetWorkflowHistory(ctx, r.id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return 0, err
		}
		if a := e.GetActivityTaskScheduledEventAttributes(); a != nil && a.GetActivityType().GetName() == activities.NameExecute {
			n++
		}
	}
	return n, nil
}

// cpuTimes are CPU times, by part: each host's worker and sandboxd (with
// the sandboxes it ran), and this process (the Temporal server, and the
// demo's client).
type cpuTimes map[string]time.Duration

func (d *demo) cpu() cpuTimes {
	out := cpuTimes{"temporal": selfCPU()}
	for _, h := range d.hosts {
		out[h.name+" worker"] = bench.ProcCPU(h.worker.Process.Pid)
		// Its lease inits are reaped by its spawner, a live child.
		out[h.name+" sandboxd"] = bench.ProcCPU(h.sandboxd.Process.Pid) + bench.LiveChildrenCPU(h.sandboxd.Process.Pid)
	}
	return out
}

// reportCPU prints the CPU time per run of each part.
func (d *demo) reportCPU(before, after cpuTimes, runs int) {
	per := func(part string) time.Duration { return (after[part] - before[part]) / time.Duration(runs) }
	fmt.Println("\nCPU time per run:")
	fmt.Println("\n| part | per run |")
	fmt.Println("|---|---:|")
	var hosts time.Duration
	for _, h := range d.hosts {
		for _, part := range []string{h.name + " worker", h.name + " sandboxd"} {
			hosts += per(part)
		}
	}
	var workers, sandboxds time.Duration
	for _, h := range d.hosts {
		workers += per(h.name + " worker")
		sandboxds += per(h.name + " sandboxd")
	}
	fmt.Printf("| workers (host mode) | %s |\n", workers.Round(100*time.Microsecond))
	fmt.Printf("| sandboxd and its sandboxes | %s |\n", sandboxds.Round(100*time.Microsecond))
	fmt.Printf("| a host, in all | %s |\n", hosts.Round(100*time.Microsecond))
	fmt.Printf("| Temporal server (this process) | %s |\n", per("temporal").Round(100*time.Microsecond))
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// checkClean waits until hosts hold no lease and no sandbox process runs
// under their roots.
func (d *demo) checkClean(ctx context.Context, hosts []*host) {
	for _, h := range hosts {
		deadline := time.Now().Add(time.Minute)
		for {
			leases, err := h.provider.ListLeases(ctx, nil)
			pids, perr := localsandbox.SandboxProcesses(filepath.Join(h.root, "sandbox"))
			if err == nil && perr == nil && len(leases) == 0 && len(pids) == 0 {
				fmt.Printf("%s: no lease, no sandbox process\n", h.name)
				break
			}
			if time.Now().After(deadline) {
				d.failed("%s still holds %d leases and %d processes (%v %v)", h.name, len(leases), len(pids), err, perr)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// measureLeases makes n idle leases on one sandboxd and prints what they
// cost: the memory (PSS) of sandboxd and of every sandbox process, and
// the disk under its root, before and after.
func (d *demo) measureLeases(ctx context.Context, n int) error {
	var err error
	if d.dir, err = os.MkdirTemp("", "sandboxflow-lease-cost-"); err != nil {
		return err
	}
	defer os.RemoveAll(d.dir)
	h := &host{name: "host", root: filepath.Join(d.dir, "host"), key: rand.Text()}
	port, err := freePort()
	if err != nil {
		return err
	}
	h.listen = "127.0.0.1:" + strconv.Itoa(port)
	if h.provider, err = createos.New(createos.Config{BaseURL: "http://" + h.listen, APIKey: h.key}); err != nil {
		return err
	}
	if err := os.MkdirAll(h.root, 0o711); err != nil {
		return err
	}
	if err := h.startSandboxd(d); err != nil {
		return err
	}
	d.hosts = []*host{h}
	defer d.stopHosts()
	root := filepath.Join(h.root, "sandbox")
	memBefore, diskBefore := h.memory(root), diskUsage(root)
	var leases []string
	began := time.Now()
	for range n {
		lease, err := h.provider.CreateLease(ctx, sandbox.LeaseSpec{})
		if err != nil {
			return err
		}
		leases = append(leases, lease.ID)
	}
	created := time.Since(began)
	time.Sleep(2 * time.Second) // let the inits settle
	memAfter, diskAfter, groups := h.memory(root), diskUsage(root), cgroupMemory(root)
	for _, id := range leases {
		if err := h.provider.DestroyLease(ctx, id); err != nil {
			return err
		}
	}
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	fmt.Printf("%d idle leases (default shape) on one sandboxd, made in %s (%s each)\n\n", n, created.Round(time.Millisecond), (created / time.Duration(n)).Round(time.Millisecond))
	fmt.Println("| | before | after | per lease |")
	fmt.Println("|---|---:|---:|---:|")
	fmt.Printf("| memory (PSS of sandboxd and sandbox processes) | %s | %s | %s |\n", mib(memBefore), mib(memAfter), mib((memAfter-memBefore)/int64(n)))
	if groups > 0 {
		fmt.Printf("| memory charged to the leases' cgroups (processes, page cache, kernel) | | %s | %s |\n", mib(groups), mib(groups/int64(n)))
	}
	fmt.Printf("| disk under the root | %s | %s | %s |\n", mib(diskBefore), mib(diskAfter), mib((diskAfter-diskBefore)/int64(n)))
	return nil
}

// cgroupMemory is the memory charged to the group of the sandboxd whose
// root is root, with every lease's group below it (cgroup v1 or v2), as
// /proc/PID/cgroup of a sandbox process places it; 0 without cgroups.
func cgroupMemory(root string) int64 {
	pids, _ := localsandbox.SandboxProcesses(root)
	if len(pids) == 0 {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pids[0]))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		server := filepath.Dir(parts[2]) // the lease's group is below the server's
		for _, file := range []string{
			filepath.Join("/sys/fs/cgroup/memory", server, "memory.usage_in_bytes"), // v1
			filepath.Join("/sys/fs/cgroup", server, "memory.current"),               // v2
		} {
			if (parts[1] == "memory" || parts[0] == "0") && file != "" {
				if b, err := os.ReadFile(file); err == nil {
					n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
					return n
				}
			}
		}
	}
	return 0
}

// memory is the PSS of the host's sandboxd and of every sandbox process
// under root.
func (h *host) memory(root string) int64 {
	pids, _ := localsandbox.SandboxProcesses(root)
	total := pss(h.sandboxd.Process.Pid)
	for _, pid := range pids {
		total += pss(pid)
	}
	return total
}

// pss is a process's proportional set size, in bytes.
func pss(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Pss:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// diskUsage is the space the files under root take (their blocks).
func diskUsage(root string) int64 {
	var total int64
	filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Lstat(path, &st) == nil {
			total += st.Blocks * 512
		}
		return nil
	})
	return total
}
