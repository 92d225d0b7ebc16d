// The official TypeScript SDK (@nodeops-createos/sandbox), unchanged,
// through its ordinary public flows against sandboxd. Run by
// TestOfficialTypeScriptSDK (officialsdk_test.go), which installs the SDK
// next to this file and reads one JSON line per check from stdout:
//   {"check":"<name>","ok":true} or {"check":"<name>","ok":false,"error":"…"}
//
// Environment: SDK_BASE_URL, SDK_API_KEY; what the server under test can
// do: SDK_CAN_INGRESS, SDK_CAN_FORK, SDK_EGRESS_ENFORCED ("1" or "").
// Where it cannot, the check asserts the documented refusal instead.
import {
  CreateosSandboxClient,
  CreateosSandboxError,
  CreateosSandboxApiError,
  CreateosSandboxAuthError,
  CreateosSandboxNotFoundError,
  CreateosSandboxPermissionError,
  CreateosSandboxValidationError,
} from "@nodeops-createos/sandbox";

const baseUrl = process.env.SDK_BASE_URL;
const apiKey = process.env.SDK_API_KEY;
const canIngress = process.env.SDK_CAN_INGRESS === "1";
const canFork = process.env.SDK_CAN_FORK === "1";
const egressEnforced = process.env.SDK_EGRESS_ENFORCED === "1";
const canResize = process.env.SDK_CAN_RESIZE === "1";

const client = new CreateosSandboxClient({ baseUrl, apiKey });
const secret = "s3cret-" + Math.random().toString(36).slice(2);
const name = "sdk-flows-" + Math.random().toString(36).slice(2, 10);
let sb; // the sandbox of the flows, once created

function assert(cond, what) {
  if (!cond) throw new Error(what);
}

function eq(got, want, what) {
  const g = JSON.stringify(got);
  const w = JSON.stringify(want);
  if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`);
}

// rfc3339 checks a timestamp as Go's time.Time would parse it.
function rfc3339(v, what) {
  assert(
    typeof v === "string" && /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/.test(v) && !isNaN(Date.parse(v)),
    `${what} is not an RFC 3339 time: ${JSON.stringify(v)}`,
  );
}

// rejects runs fn and checks that it throws an instance of cls whose
// status is one of statuses, with a string code and a request id.
async function rejects(fn, cls, statuses, what) {
  try {
    await fn();
  } catch (err) {
    assert(err instanceof cls, `${what}: threw ${err?.name} (${err?.message}), want ${cls.name}`);
    if (statuses) {
      assert(statuses.includes(err.statusCode), `${what}: HTTP ${err.statusCode}, want ${statuses}`);
      assert(typeof err.code === "string" && err.code.length > 0, `${what}: no machine code (data.code)`);
      assert(typeof err.requestId === "string" && err.requestId.length > 0, `${what}: no X-Request-Id`);
    }
    return err;
  }
  throw new Error(`${what}: did not throw`);
}

function needSandbox() {
  if (!sb) throw new Error("no sandbox: the create check failed");
  return sb;
}

async function check(name, fn) {
  let line;
  try {
    await fn();
    line = { check: name, ok: true };
  } catch (err) {
    const status = err?.statusCode ? ` (HTTP ${err.statusCode})` : "";
    const where = String(err?.stack ?? "").split("\n").find((l) => l.includes("flows.mjs")) ?? "";
    line = { check: name, ok: false, error: `${err?.name}${status}: ${err?.message} ${where.trim()}` };
  }
  process.stdout.write(JSON.stringify(line) + "\n");
}

await check("health", async () => {
  eq(await client.healthz(), { up: true }, "healthz");
  const ready = await client.readyz();
  eq(ready.ready, true, "readyz.ready");
  // Public routes need no key.
  const anonymous = new CreateosSandboxClient({ baseUrl, apiKey: "wrong-key" });
  eq(await anonymous.healthz(), { up: true }, "healthz with a wrong key");
});

await check("shapes", async () => {
  const anonymous = new CreateosSandboxClient({ baseUrl, apiKey: "wrong-key" });
  const shapes = await anonymous.listShapes();
  assert(shapes.length >= 1, "no shapes");
  const one = shapes.find((s) => s.id === "s-1vcpu-1gb");
  assert(one, "no s-1vcpu-1gb");
  eq([one.vcpu, one.mem_mib], [1, 1024], "s-1vcpu-1gb vcpu, mem_mib");
  assert(Number.isInteger(one.default_disk_mib) && one.default_disk_mib > 0, "default_disk_mib");
  for (const s of shapes) assert(Number.isInteger(s.vcpu), `${s.id}: vcpu ${s.vcpu} is not an integer`);
  const quarter = shapes.find((s) => s.id === "s-0.25vcpu-512mb");
  assert(quarter && quarter.cpu_quota_pct === 25, "s-0.25vcpu-512mb has no cpu_quota_pct 25");
  const capped = await anonymous.listSandboxes().catch((e) => e);
  assert(capped instanceof CreateosSandboxAuthError, "the sandbox list answered without a key");
});

await check("rootfs", async () => {
  const rootfs = await client.listRootfs();
  assert(Array.isArray(rootfs.rootfs) && rootfs.rootfs.length >= 1, "rootfs list");
  assert(typeof rootfs.default === "string" && rootfs.rootfs.includes(rootfs.default), "default rootfs not listed");
});

await check("whoami", async () => {
  const me = await client.whoami();
  assert(typeof me.user_id === "string" && me.user_id.length > 0, "user_id");
  for (const k of ["running", "paused", "other", "total"]) assert(Number.isInteger(me.stats?.[k]), `stats.${k}`);
});

await check("create", async () => {
  const request = {
    shape: "s-1vcpu-1gb",
    name,
    envs: { SDK_GREETING: "hello from envs", SDK_SECRET: secret },
    egress: egressEnforced ? ["10.0.2.2:8080"] : ["*"],
    disk_mib: 512,
    auto_pause_after_seconds: 600,
    ingress_enabled: canIngress,
  };
  const created = await client.createSandbox(request);
  sb = created;
  eq(created.status, "running", "status");
  eq(created.name, name, "name");
  const d = created.data;
  assert(typeof d.id === "string" && d.id.length > 0, "id");
  eq([d.shape, d.vcpu, d.mem_mib, d.disk_mib], ["s-1vcpu-1gb", 1, 1024, 512], "shape, vcpu, mem_mib, disk_mib");
  eq(d.bandwidth_quota_bytes, -1, "bandwidth_quota_bytes");
  eq(d.auto_pause_after_seconds, 600, "auto_pause_after_seconds");
  assert(typeof d.spawn_ms === "number" && d.spawn_ms >= 0, "spawn_ms");
  assert(typeof d.ip === "string" && d.ip.length > 0, "ip");
  // Nothing in force reads ["none"]: [] would mean "allow all" to the SDK.
  eq(d.egress, egressEnforced ? ["10.0.2.2:8080"] : ["none"], "egress in force");
  assert(!JSON.stringify(d).includes(secret), "the create answer holds an env value");
  if (canIngress) {
    const url = created.previewUrl(8080, { scheme: "http" });
    // The lease's preview address, an address: nothing to resolve.
    assert(/^http:\/\/127\.100\.\d+\.\d+:8080\/?$/.test(url), `preview URL ${url}`);
  }
});

await check("get", async () => {
  const got = await client.getSandbox(needSandbox().id);
  const v = got.data;
  eq([v.id, v.status, v.name], [sb.id, "running", name], "id, status, name");
  eq([v.vcpu, v.mem_mib, v.disk_mib, v.shape], [1, 1024, 512, "s-1vcpu-1gb"], "vcpu, mem_mib, disk_mib, shape");
  rfc3339(v.created_at, "created_at");
  rfc3339(v.running_at, "running_at");
  eq([...(v.envs ?? [])].sort(), ["SDK_GREETING", "SDK_SECRET"], "envs (names)");
  assert(!JSON.stringify(v).includes(secret), "the view holds an env value");
  eq(v.ingress_enabled, canIngress, "ingress_enabled");
  eq(v.auto_pause_after_seconds, 600, "auto_pause_after_seconds");
  assert(typeof v.rootfs === "string" && v.rootfs.length > 0, "rootfs");
});

await check("runCommand", async () => {
  const out = await needSandbox().runCommand("sh", ["-c", 'printf %s "$SDK_GREETING"; echo oops >&2; exit 3']);
  eq([out.result.stdout, out.result.stderr, out.result.exit_code], ["hello from envs", "oops\n", 3], "result");
  assert(typeof out.exec_ms === "number", "exec_ms");
  const missing = await sb.runCommand("no-such-program-xyz");
  assert(missing.result.exit_code !== 0 && typeof missing.result.error === "string", "a missing program has result.error");
});

await check("sh", async () => {
  const out = await needSandbox().sh("echo hi; echo $SDK_GREETING >&2");
  eq([out.result.stdout, out.result.stderr, out.result.exit_code], ["hi\n", "hello from envs\n", 0], "result");
  const err = await rejects(() => sb.sh("exit 4", { label: "four" }), CreateosSandboxError, null, "sh exit 4");
  assert(!(err instanceof CreateosSandboxApiError) && err.message.includes("four: command exited 4"), err.message);
});

await check("streamCommand", async () => {
  let stdout = "";
  let stderr = "";
  let exit;
  for await (const ev of needSandbox().streamCommand("sh", ["-c", 'echo one; echo two >&2; printf "%s" "$SDK_GREETING"; exit 5'])) {
    if (ev.type === "stdout") stdout += ev.data;
    if (ev.type === "stderr") stderr += ev.data;
    if (ev.type === "exit") exit = ev.exitCode;
    if (ev.type === "error") throw new Error("error event: " + ev.message);
  }
  eq([stdout, stderr, exit], ["one\nhello from envs", "two\n", 5], "stream");
});

await check("files", async () => {
  await needSandbox().sh("mkdir -p /workspace/sdk"); // the service needs the parent to exist
  await sb.files.upload("/workspace/sdk/hello.txt", "hello, file");
  eq(new TextDecoder().decode(await sb.files.download("/workspace/sdk/hello.txt")), "hello, file", "text round trip");
  const bytes = new Uint8Array(256).map((_, i) => i);
  await sb.files.upload("/workspace/sdk/bytes.bin", bytes);
  eq([...new Uint8Array(await sb.files.download("/workspace/sdk/bytes.bin"))], [...bytes], "binary round trip");
  const out = await sb.sh("cat /workspace/sdk/hello.txt");
  eq(out.result.stdout, "hello, file", "the command sees the upload");
  await rejects(() => sb.files.download("/workspace/sdk/missing"), CreateosSandboxNotFoundError, [404], "missing file");
  await rejects(() => sb.files.upload("relative.txt", "x"), CreateosSandboxValidationError, [400], "relative path");
  if (canFork) {
    // Namespace isolation: any file of the sandbox's own root.
    await sb.files.upload("/etc/sdk.conf", "conf");
    eq(new TextDecoder().decode(await sb.files.download("/etc/sdk.conf")), "conf", "a file under /etc");
    eq((await sb.sh("stat -c %u:%g /etc/sdk.conf")).result.stdout, "0:0\n", "owned by the sandbox's root");
    await rejects(() => sb.files.download("/proc/1/environ"), CreateosSandboxValidationError, [400], "a file of /proc");
  }
});

// The vendor's preview flow (examples/03-dev-server-preview-url): start a
// server in the background, waitForPortReady (an exec probing the port from
// inside), then fetch the preview URL at once. The URL must serve as soon as
// the probe says the port is ready; three ports, since a late URL is late
// only by chance.
await check("previewUrl", async () => {
  if (!canIngress) return;
  for (const port of [8081, 8082, 8083]) {
    await needSandbox().sh(
      `mkdir -p /tmp/www${port} && echo preview ${port} > /tmp/www${port}/index.html && ` +
        `cd /tmp/www${port} && nohup setsid python3 -m http.server ${port} --bind 0.0.0.0 >/dev/null 2>&1 &`,
    );
    await sb.waitForPortReady(port, { timeoutMs: 10_000 });
    const res = await fetch(sb.previewUrl(port, { scheme: "http" }));
    eq([res.status, await res.text()], [200, `preview ${port}\n`], `GET the preview URL of port ${port}`);
  }
  await sb.sh("pkill -f 'http.server 808[123]' || true");
});

await check("sshKeys", async () => {
  const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKKAMadsz89A1JchvIhouTeibWdAaWwd4uuGxi1NgW4l one@test";
  eq(await needSandbox().addSSHPubkeys([key]), { count: 1 }, "addSSHPubkeys");
  eq(await sb.addSSHPubkeys([key]), { count: 1 }, "the same key again");
  await sb.refresh();
  eq(sb.data.ssh_pubkeys, [key], "the view's keys");
});

// A sandbox's ip is its own address (namespace isolation), and by-ip finds
// it; under process-group isolation all share 127.0.0.1, which names none.
await check("getSandboxByIP", async () => {
  const ip = needSandbox().data.ip;
  if (canFork) {
    const got = await client.getSandboxByIP(ip);
    eq([got.id, got.data.ip], [sb.id, ip], "the sandbox of its ip");
  } else {
    await rejects(() => client.getSandboxByIP(ip), CreateosSandboxApiError, [409], "by-ip of the shared 127.0.0.1");
  }
  await rejects(() => client.getSandboxByIP("127.100.255.77"), CreateosSandboxNotFoundError, [404], "an address no sandbox has");
});

// The disk grows online where the server can grow it; elsewhere resize is
// a validation error naming why.
await check("resize", async () => {
  const before = needSandbox().data.disk_mib;
  await rejects(() => sb.resize(before), CreateosSandboxValidationError, [400], "a size not larger");
  if (canResize) {
    eq(await sb.resize(before + 64), { id: sb.id, disk_mib: before + 64 }, "resize");
    await sb.refresh();
    eq(sb.data.disk_mib, before + 64, "disk_mib after the resize");
  } else {
    const err = await rejects(() => sb.resize(before + 64), CreateosSandboxValidationError, [400], "resize where disks cannot grow");
    eq(err.code, "UNSUPPORTED", "the refusal's code");
  }
});

// Routes the server lacks are a validation error naming the feature, never
// "not found" (which would say the sandbox is gone).
await check("declinedRoutes", async () => {
  for (const [what, fn] of [
    ["listHosts", () => client.listHosts()],
    ["networks.list", () => client.networks.list()],
    ["disks.list", () => client.disks.list()],
    ["attachNetwork", () => sb.attachNetwork("net-1")],
  ]) {
    const err = await rejects(fn, CreateosSandboxValidationError, [400], what);
    assert(err.code === "UNSUPPORTED" && err.message.includes("not supported"), `${what}: ${err.code} ${err.message}`);
  }
});

await check("egress", async () => {
  const got = await needSandbox().getEgress();
  eq(got, { id: sb.id, egress: egressEnforced ? ["10.0.2.2:8080"] : ["none"] }, "getEgress");
  if (egressEnforced) {
    const set = await sb.setEgress(["10.0.2.3:53", "10.9.9.9:443"]);
    eq(set, { id: sb.id, egress: ["10.0.2.3:53", "10.9.9.9:443"] }, "setEgress");
    eq(await sb.getEgress(), set, "getEgress after setEgress");
  } else {
    // A rule beyond the server's policy (off) is refused, not stored as nothing.
    const err = await rejects(() => sb.setEgress(["10.9.9.9:443"]), CreateosSandboxPermissionError, [403], "a rule under egress off");
    eq(err.code, "EGRESS_NOT_ALLOWED", "the refusal's code");
    eq(await sb.getEgress(), got, "getEgress after a refused setEgress");
  }
  // Allow all: all that the policy allows (allowlist without operator rules, or off: nothing).
  const all = await sb.setEgress(null);
  eq(all, { id: sb.id, egress: ["none"] }, "setEgress(null)");
  await rejects(() => sb.setEgress(["not a rule"]), CreateosSandboxValidationError, [400], "a bad rule");
});

await check("patch", async () => {
  await needSandbox().setAutoPause(null);
  eq(sb.data.auto_pause_after_seconds, undefined, "auto-pause disabled");
  await sb.setAutoPause(120);
  eq(sb.data.auto_pause_after_seconds, 120, "auto-pause 120");
  await rejects(() => sb.setAutoPause(5), CreateosSandboxValidationError, [400], "auto-pause 5 s");
  if (canIngress) {
    await sb.setIngress(false);
    eq([sb.data.ingress_enabled, sb.data.ingress_url_template], [false, undefined], "ingress off");
    await sb.setIngress(true);
    assert(sb.data.ingress_enabled && sb.data.ingress_url_template?.includes("<port>"), "ingress on");
  } else {
    await rejects(() => sb.setIngress(true), CreateosSandboxValidationError, [400], "ingress without a network");
  }
});

await check("pauseResume", async () => {
  await needSandbox().pause();
  assert(["pausing", "paused"].includes(sb.status), `pause answered ${sb.status}`);
  await sb.waitUntilPaused({ timeoutMs: 30_000 });
  rfc3339(sb.data.paused_at, "paused_at");
  await rejects(() => sb.runCommand("true"), CreateosSandboxValidationError, [409], "exec while paused");
  await sb.resume();
  assert(["resuming", "running"].includes(sb.status), `resume answered ${sb.status}`);
  await sb.waitUntilRunning({ timeoutMs: 30_000 });
  rfc3339(sb.data.last_resumed_at, "last_resumed_at");
  eq((await sb.sh("echo back")).result.stdout, "back\n", "a command after resume");
});

await check("fork", async () => {
  await needSandbox().pause();
  await sb.waitUntilPaused({ timeoutMs: 30_000 });
  if (!canFork) {
    await rejects(() => sb.fork(), CreateosSandboxValidationError, [400, 409], "fork without namespaces");
  } else {
    await rejects(() => sb.fork({ ssh_pubkeys: ["ssh-ed25519 AAAA"] }), CreateosSandboxValidationError, [400], "fork with ssh keys");
    const fork = await sb.fork({ envs: { SDK_GREETING: "forked" } });
    assert(fork.id !== sb.id, "the fork has the source's id");
    eq(fork.data.forked_from, sb.id, "forked_from");
    assert(["forking", "running"].includes(fork.status), `fork answered ${fork.status}`);
    await fork.waitUntilRunning({ timeoutMs: 60_000 });
    const out = await fork.sh('cat /workspace/sdk/hello.txt; echo " $SDK_GREETING"');
    eq(out.result.stdout, "hello, file forked\n", "the fork's files and envs");
    const paused = await sb.fork({ start_paused: true });
    eq(paused.status, "paused", "a start_paused fork is answered paused");
    await paused.waitUntilPaused({ timeoutMs: 60_000 });
    await fork.destroy();
    await paused.destroy();
  }
  await sb.resume();
  await sb.waitUntilRunning({ timeoutMs: 30_000 });
});

await check("list", async () => {
  const all = await client.listSandboxes();
  const mine = all.find((s) => s.id === needSandbox().id);
  assert(mine && mine.name === name && mine.status === "running", "the sandbox is not listed");
  const running = await client.listSandboxes({ status: "running" });
  assert(running.some((s) => s.id === sb.id), "not in status=running");
  assert(running.every((s) => s.status === "running"), "status=running lists others");
  eq((await client.listSandboxes({ limit: 1 })).length, 1, "limit 1");
  const page = await client.http.request("GET", "/v1/sandboxes", { query: { limit: 1, offset: 0 } });
  eq([page.data.length, page.pagination.limit, page.pagination.offset, page.pagination.count], [1, 1, 0, 1], "a page");
  assert(page.pagination.total >= 1, "pagination.total");
  const taken = await rejects(() => client.createSandbox({ shape: "s-1vcpu-1gb", name }), CreateosSandboxValidationError, [409], "a taken name");
  assert(!taken.message.includes(secret), "the 409 echoes an env value");
});

await check("destroy", async () => {
  const id = needSandbox().id;
  const res = await sb.destroy();
  eq(res.id, id, "destroy id");
  assert(["destroying", "destroyed"].includes(res.status), `destroy answered ${res.status}`);
  await sb.waitUntilDestroyed({ timeoutMs: 60_000 });
  const gone = await client.getSandbox(id);
  eq(gone.status, "destroyed", "GET after destroy");
  rfc3339(gone.data.destroyed_at, "destroyed_at");
  eq((await gone.destroy()).status, "destroyed", "a second destroy");
  const destroyed = await client.listSandboxes({ status: "destroyed" });
  assert(destroyed.some((s) => s.id === id), "not in status=destroyed");
  assert(!(await client.listSandboxes()).some((s) => s.id === id), "the default list shows a destroyed sandbox");
});

// Templates need what forks need: namespace isolation, an image per lease.
await check("templates", async () => {
  const tname = "sdk-tpl-" + Math.random().toString(36).slice(2, 10);
  const dockerfile = 'FROM devbox:1\nENV WHO=sdk\nRUN echo "built by $WHO" > /opt/sdk-marker && echo step-done\n';
  if (!canFork) {
    await rejects(() => client.templates.create({ name: tname, dockerfile }), CreateosSandboxValidationError, [400], "templates without namespaces");
    return;
  }
  const tpl = await client.templates.create({ name: tname, dockerfile });
  eq([tpl.name, tpl.status], [tname, "pending"], "create");
  rfc3339(tpl.created_at, "created_at");
  const lines = [];
  let final;
  for await (const e of client.templates.followLogs(tpl.id)) {
    if (e.final) {
      final = e;
      break;
    }
    if (e.line) lines.push(e.line);
  }
  eq(final?.status, "ready", `the final event (log: ${lines.join(" | ")})`);
  assert(lines.includes("step-done"), "the step's output is not in the followed log");
  const got = await client.templates.get(tname, { include: "dockerfile" });
  eq([got.id, got.status, got.dockerfile], [tpl.id, "ready", dockerfile], "get by name with the dockerfile");
  rfc3339(got.built_at, "built_at");
  assert(got.ext4_size_bytes > 0, "ext4_size_bytes");
  assert((await client.templates.list()).some((t) => t.id === tpl.id), "the template is not listed");
  assert((await client.listRootfs()).rootfs.includes(tname), "GET /v1/rootfs does not list the template");
  assert((await client.templates.logs(tpl.id)).includes("step-done\n"), "the plain log");
  const box = await client.createSandbox({ shape: "s-1vcpu-1gb", rootfs: tname });
  try {
    eq((await box.sh("cat /opt/sdk-marker")).result.stdout, "built by sdk\n", "a sandbox on the template");
    eq(await client.templates.delete(tpl.id), { id: tpl.id, ok: true }, "delete");
    await rejects(() => client.templates.get(tpl.id), CreateosSandboxNotFoundError, [404], "get a deleted template");
    await rejects(() => client.createSandbox({ shape: "s-1vcpu-1gb", rootfs: tname }), CreateosSandboxNotFoundError, [404], "create on a deleted template");
    eq((await box.sh("cat /opt/sdk-marker")).result.stdout, "built by sdk\n", "a sandbox on a deleted template");
  } finally {
    await box.destroy();
  }
});

await check("errors", async () => {
  await rejects(() => client.getSandbox("sb-no-such-sandbox"), CreateosSandboxNotFoundError, [404], "unknown id");
  await rejects(() => client.createSandbox({ shape: "s-99vcpu-1tb" }), CreateosSandboxValidationError, [400], "unknown shape");
  const wrong = new CreateosSandboxClient({ baseUrl, apiKey: "wrong-key" });
  await rejects(() => wrong.whoami(), CreateosSandboxAuthError, [401], "wrong key");
  const ssh = await rejects(
    () => client.createSandbox({ shape: "s-1vcpu-1gb", ssh_pubkeys: ["ssh-ed25519 AAAA"] }),
    CreateosSandboxValidationError,
    [400],
    "ssh_pubkeys",
  );
  assert(ssh.message.includes("ssh_pubkeys"), `the 400 does not name ssh_pubkeys: ${ssh.message}`);
  await rejects(
    () => client.createSandbox({ shape: "s-1vcpu-1gb", bandwidth_quota_bytes: 1 << 20 }),
    CreateosSandboxValidationError,
    [400],
    "bandwidth_quota_bytes",
  );
  await rejects(
    () => client.createSandbox({ shape: "s-1vcpu-1gb", auto_pause_after_seconds: 59 }),
    CreateosSandboxValidationError,
    [400],
    "auto_pause_after_seconds 59",
  );
});

process.stdout.write(JSON.stringify({ done: true }) + "\n");
