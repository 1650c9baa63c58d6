// Fixtures for the MCP tests: the travel example's providers, tools file and
// auth file (from the TypeScript client's helpers), `idem serve` with /mcp,
// `idem mcp` over stdio, and the official SDK client on either transport.

import { spawn } from "node:child_process";
import path from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

export * from "../../../clients/typescript/test/helpers.mjs";
import { IDEM_BIN, SOURCE_DIR, approvalToolsFile, readLedger } from "../../../clients/typescript/test/helpers.mjs";

export const TRIP_SPEC = path.join(SOURCE_DIR, "examples/travel_booking/trip.json");

/**
 * The travel tools file for MCP: each booking names its undo (open sagas),
 * and payments.charge is previewed and waits for a person (two-phase, human
 * approval).
 */
export function mcpToolsFile(dir, providersPort) {
  return approvalToolsFile(dir, providersPort);
}

/** The SDK client connected to `/mcp` of `server` with a bearer token. */
export async function httpClient(server, token, name = "idem-mcp-test") {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(`${server.baseUrl}/mcp`), {
    requestInit: { headers },
  });
  const client = new Client({ name, version: "1.0.0" });
  await client.connect(transport);
  return { client, transport };
}

/** The SDK client with `idem mcp` as its subprocess. */
export async function stdioClient(args, name = "idem-mcp-stdio-test") {
  const transport = new StdioClientTransport({ command: IDEM_BIN, args, stderr: "pipe" });
  const client = new Client({ name, version: "1.0.0" });
  await client.connect(transport);
  return { client, transport };
}

/** Runs `idem mcp` with `lines` on stdin; its stdout lines, stderr and exit. */
export function runStdioRaw(args, lines, { timeoutMs = 20000 } = {}) {
  return new Promise((resolve, reject) => {
    const proc = spawn(IDEM_BIN, args, { stdio: ["pipe", "pipe", "pipe"] });
    let out = "";
    let err = "";
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`idem mcp did not end within ${timeoutMs} ms: ${err}`));
    }, timeoutMs);
    proc.stdout.on("data", (d) => (out += d));
    proc.stderr.on("data", (d) => (err += d));
    proc.on("exit", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout: out.split("\n").filter((l) => l.length > 0), stderr: err });
    });
    for (const l of lines) proc.stdin.write(l + "\n");
    proc.stdin.end();
  });
}

/** Effects in the providers' ledger of one operation ("hotels", "book"). */
export function effects(ledger, provider, operation) {
  const doc = readLedger(ledger);
  return doc.effects.filter((e) => e.provider === provider && e.operation === operation);
}

/** The approvals an approver sees; waits until `n` are listed. */
export async function approvals(server, token, n = 1, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await fetch(`${server.baseUrl}/v1/approvals`, { headers: { Authorization: `Bearer ${token}` } });
    const body = await r.json();
    if ((body.approvals ?? []).length >= n || Date.now() > deadline) return body.approvals ?? [];
    await new Promise((res) => setTimeout(res, 100));
  }
}

export async function approve(server, token, commitToken) {
  const r = await fetch(`${server.baseUrl}/v1/approvals/${commitToken}/approve`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify({ note: "approved in the MCP test" }),
  });
  return { status: r.status, body: await r.json() };
}

export const BOOK_HOTEL = { traveller: "ada", city: "Rome", check_in: "2026-06-01", check_out: "2026-06-05", currency: "EUR" };
export const BOOK_FLIGHT = { traveller: "ada", from: "LHR", to: "FCO", date: "2026-06-01", return_date: "2026-06-05", currency: "EUR" };
export const CHARGE = { traveller: "ada", amount_cents: 184000, currency: "EUR", description: "Rome trip" };

/** `idem serve` on journal `store` (a SQLite file or a PostgreSQL URL) with `keys`. */
export async function startServerOn(store, { tools, auth, keys }) {
  const { freePort } = await import("../../../clients/typescript/test/helpers.mjs");
  const port = await freePort();
  const args = ["--store", store, "--keys", keys, "serve", "--listen", `127.0.0.1:${port}`, "--workers", "2", "--auth", auth, "--tools", tools];
  const proc = spawn(IDEM_BIN, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  proc.stdout.on("data", (d) => (out = (out + d).slice(-8000)));
  proc.stderr.on("data", (d) => (out = (out + d).slice(-8000)));
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  const baseUrl = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 15000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`idem serve exited ${proc.exitCode}: ${out}`);
    try {
      if ((await fetch(`${baseUrl}/healthz`)).ok) break;
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) throw new Error(`idem serve did not answer: ${out}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    port,
    baseUrl,
    async stop() {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      await exited;
    },
  };
}
