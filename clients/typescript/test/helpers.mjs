// Test fixtures: a real `idem serve` and the travel example's providers on
// loopback, started from the binaries CTest passes (IDEM_BIN,
// TRAVEL_PROVIDERS_BIN, TRAVEL_LEDGER_BIN, IDEM_SOURCE_DIR), the providers'
// ledger, and a scripted model for the OpenAI Agents SDK.

import { spawn, execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync, chmodSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
export const SOURCE_DIR = process.env.IDEM_SOURCE_DIR ?? path.resolve(here, "../../..");
const BUILD = path.join(SOURCE_DIR, "build");
export const IDEM_BIN = process.env.IDEM_BIN ?? path.join(BUILD, "idem");
export const PROVIDERS_BIN =
  process.env.TRAVEL_PROVIDERS_BIN ?? path.join(BUILD, "examples/travel_booking/travel-providers");
export const LEDGER_BIN = process.env.TRAVEL_LEDGER_BIN ?? path.join(BUILD, "examples/travel_booking/travel-ledger");

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export function tempDir(prefix) {
  return mkdtempSync(path.join(tmpdir(), `idem-ts-${prefix}-`));
}

async function waitHealthy(url, proc, what, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`${what} exited with ${proc.exitCode}: ${proc.output()}`);
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what}: no answer from ${url} within ${timeoutMs} ms: ${proc.output()}`);
}

function start(bin, args, what) {
  const proc = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  proc.stdout.on("data", (d) => (out = (out + d).slice(-8000)));
  proc.stderr.on("data", (d) => (out = (out + d).slice(-8000)));
  proc.output = () => out;
  proc.exited = new Promise((resolve) => proc.once("exit", (code, signal) => resolve({ code, signal })));
  proc.what = what;
  return proc;
}

/** The travel providers over HTTP, with their ledger in `dir`. */
export async function startProviders(dir, extraArgs = []) {
  const port = await freePort();
  const ledger = path.join(dir, "ledger.sqlite");
  const proc = start(PROVIDERS_BIN, ["--listen", `127.0.0.1:${port}`, "--ledger", ledger, ...extraArgs], "travel-providers");
  await waitHealthy(`http://127.0.0.1:${port}/healthz`, proc, "travel-providers");
  return {
    port,
    ledger,
    proc,
    async stop() {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      await proc.exited;
    },
  };
}

/** How an open saga undoes each travel booking (the tools file's "compensate"). */
const OPEN_COMPENSATIONS = {
  "flights.reserve": { tool: "flights.cancel", args: { reservation_id: "${result.reservation_id}" } },
  "hotels.book": { tool: "hotels.cancel", args: { booking_id: "${result.booking_id}" } },
  "cars.rent": { tool: "cars.return", args: { rental_id: "${result.rental_id}" } },
  "payments.charge": { tool: "payments.refund", args: { charge_id: "${result.charge_id}", amount_cents: "${result.amount_cents}" } },
};

/**
 * The tools file of the travel example, pointed at the providers' port;
 * with `open`, every booking tool that declares no compensation of its own
 * gets the travel example's (for open sagas, which have no spec to say it).
 */
export function toolsFile(dir, providersPort, { open = false } = {}) {
  const src = readFileSync(path.join(SOURCE_DIR, "examples/travel_booking/tools.http.json"), "utf8");
  const doc = JSON.parse(src.replaceAll("http://127.0.0.1:8091", `http://127.0.0.1:${providersPort}`));
  if (open) {
    for (const t of doc.tools) if (OPEN_COMPENSATIONS[t.name] && !("compensate" in t)) t.compensate = OPEN_COMPENSATIONS[t.name];
  }
  const file = path.join(dir, "tools.json");
  writeFileSync(file, JSON.stringify(doc, null, 2));
  return file;
}

/** An auth file with one caller per role; returns the tokens. */
export function authFile(dir) {
  const tokens = {
    agent: randomBytes(32).toString("hex"),
    other: randomBytes(32).toString("hex"),
    approver: randomBytes(32).toString("hex"),
    operator: randomBytes(32).toString("hex"),
  };
  const sha = (t) => createHash("sha256").update(t).digest("hex");
  const callers = [
    { name: "agent-1", token_sha256: sha(tokens.agent), roles: ["agent"] },
    { name: "agent-2", token_sha256: sha(tokens.other), roles: ["agent"] },
    { name: "maria", token_sha256: sha(tokens.approver), roles: ["approver"] },
    { name: "ops", token_sha256: sha(tokens.operator), roles: ["operator"] },
  ];
  const file = path.join(dir, "auth.json");
  writeFileSync(file, JSON.stringify(callers));
  chmodSync(file, 0o600);
  return { file, tokens };
}

/**
 * `idem serve` on a free loopback port, journal in `dir`. `restart()` starts
 * it again on the same port and journal (after a kill), `kill(signal)` stops it.
 */
export async function startServer(dir, { tools, auth, workers = 2, extraArgs = [] } = {}) {
  const port = await freePort();
  const store = path.join(dir, "journal.db");
  const args = ["--store", store, "serve", "--listen", `127.0.0.1:${port}`, "--workers", String(workers)];
  if (auth) args.push("--auth", auth);
  else args.push("--insecure-no-auth");
  if (tools) args.push("--tools", tools);
  args.push(...extraArgs);
  const server = {
    port,
    store,
    baseUrl: `http://127.0.0.1:${port}`,
    proc: undefined,
    async run() {
      this.proc = start(IDEM_BIN, args, "idem serve");
      await waitHealthy(`${this.baseUrl}/healthz`, this.proc, "idem serve");
    },
    /** Starts it without waiting for it to answer. */
    spawnOnly() {
      this.proc = start(IDEM_BIN, args, "idem serve");
      return waitHealthy(`${this.baseUrl}/healthz`, this.proc, "idem serve");
    },
    async kill(signal = "SIGKILL") {
      if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
        this.proc.kill(signal);
        await this.proc.exited;
      }
    },
    async stop() {
      await this.kill("SIGTERM");
    },
  };
  await server.run();
  return server;
}

/** The providers' ledger: effects, calls and duplicates. */
export function readLedger(ledger) {
  return JSON.parse(execFileSync(LEDGER_BIN, [ledger, "--json"], { encoding: "utf8" }));
}

/** `travel-ledger --check`: true when no effect was applied twice. */
export function ledgerClean(ledger) {
  try {
    execFileSync(LEDGER_BIN, [ledger, "--check"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

export function cleanup(dir) {
  rmSync(dir, { recursive: true, force: true });
}

export const TRIP = JSON.parse(readFileSync(path.join(SOURCE_DIR, "examples/travel_booking/trip.json"), "utf8"));
export const TRIP_INPUT = JSON.parse(readFileSync(path.join(SOURCE_DIR, "examples/travel_booking/input.json"), "utf8"));

/**
 * The travel tools file for the framework adapters' tests: every booking
 * names its undo (open sagas), and payments.charge is previewed and waits
 * for a person (two-phase, human approval).
 */
export function approvalToolsFile(dir, providersPort) {
  const file = toolsFile(dir, providersPort, { open: true });
  const doc = JSON.parse(readFileSync(file, "utf8"));
  for (const t of doc.tools) {
    if (t.name === "payments.charge") {
      t.two_phase = true;
      t.approval = "human";
    }
  }
  writeFileSync(file, JSON.stringify(doc, null, 2));
  return file;
}

/**
 * A world for the adapters: the providers (with `faults`, e.g.
 * "flights.reserve=delay(1500)@1"), `idem serve` with an auth file and the
 * approval tools file, and clients for the agent (agent-1) and the person
 * who approves (maria, role approver): two principals, as deployed.
 */
export async function adapterWorld(name, { faults = [], IdemClient } = {}) {
  const dir = tempDir(name);
  const providers = await startProviders(dir, faults.flatMap((f) => ["--fault", f]));
  const auth = authFile(dir);
  const server = await startServer(dir, { tools: approvalToolsFile(dir, providers.port), auth: auth.file });
  const retry = { attempts: 40, baseDelayMs: 50, maxDelayMs: 400 };
  return {
    dir,
    providers,
    server,
    auth,
    agent: new IdemClient({ baseUrl: server.baseUrl, token: auth.tokens.agent, retry }),
    person: new IdemClient({ baseUrl: server.baseUrl, token: auth.tokens.approver, retry }),
    /** provider.operation of every effect in the ledger, sorted. */
    effects() {
      return readLedger(providers.ledger)
        .effects.map((e) => `${e.provider}.${e.operation}`)
        .sort();
    },
    clean: () => ledgerClean(providers.ledger),
    async close() {
      await server.stop();
      await providers.stop();
      cleanup(dir);
    },
  };
}

/**
 * A child Node.js process running `script` with `env` (a crash test's agent):
 * `line(pred)` resolves with the first stdout line (parsed as JSON) that
 * `pred` accepts; `kill()` sends SIGKILL; `exited` resolves with its exit.
 */
export function child(script, env) {
  const proc = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  const lines = [];
  const waiters = [];
  let err = "";
  let buf = "";
  proc.stdout.on("data", (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const text = buf.slice(0, i);
      buf = buf.slice(i + 1);
      let doc;
      try {
        doc = JSON.parse(text);
      } catch {
        doc = { text };
      }
      lines.push(doc);
      for (const w of [...waiters]) if (w.pred(doc)) w.resolve(doc), waiters.splice(waiters.indexOf(w), 1);
    }
  });
  proc.stderr.on("data", (d) => (err = (err + d).slice(-8000)));
  const exited = new Promise((resolve) => proc.once("exit", (code, signal) => resolve({ code, signal, stderr: err, lines })));
  return {
    proc,
    lines,
    exited,
    stderr: () => err,
    line(pred, timeoutMs = 30000) {
      const found = lines.find(pred);
      if (found) return Promise.resolve(found);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`child ${script}: no such line within ${timeoutMs} ms; stderr: ${err}`)), timeoutMs);
        const w = { pred, resolve: (d) => (clearTimeout(timer), resolve(d)) };
        waiters.push(w);
        exited.then((x) => {
          if (waiters.includes(w)) {
            clearTimeout(timer);
            reject(new Error(`child ${script} exited (${x.code ?? x.signal}) before the line; stderr: ${err}`));
          }
        });
      });
    },
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
      return exited;
    },
  };
}
