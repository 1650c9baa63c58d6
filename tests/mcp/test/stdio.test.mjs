// idem as an MCP server over stdio (`idem mcp`), driven by the official
// TypeScript SDK client: negotiation, the tool list, a repeated call that
// makes one effect, a spec as a tool, rollback through idem_rollback; and
// the raw transport: every stdout line a JSON-RPC message, a malformed line
// answered with a parse error while the process goes on, EOF ends it (0).

import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import {
  BOOK_FLIGHT,
  BOOK_HOTEL,
  TRIP_INPUT,
  TRIP_SPEC,
  cleanup,
  effects,
  ledgerClean,
  mcpToolsFile,
  runStdioRaw,
  startProviders,
  stdioClient,
  tempDir,
} from "./mcp_helpers.mjs";

async function world(name) {
  const dir = tempDir(`mcp-stdio-${name}`);
  const providers = await startProviders(dir);
  const tools = mcpToolsFile(dir, providers.port);
  const args = ["--db", path.join(dir, "journal.db"), "mcp", "--tools", tools, "--spec", TRIP_SPEC];
  return {
    dir,
    providers,
    args,
    async stop() {
      await providers.stop();
      cleanup(dir);
    },
  };
}

test("over stdio: negotiate, list, a repeated call makes one effect, rollback compensates", async () => {
  const w = await world("sdk");
  try {
    const { client } = await stdioClient(w.args);
    assert.equal(client.getServerVersion().name, "idem");
    const { tools } = await client.listTools();
    const by = Object.fromEntries(tools.map((t) => [t.name, t]));
    assert.ok(by["saga.trip"], "the spec is a tool");
    assert.deepEqual(by["saga.trip"].inputSchema.required.sort(), Object.keys(TRIP_INPUT).sort());
    assert.equal(by["hotels.book"].annotations.idempotentHint, true);
    const a = await client.callTool({ name: "flights.reserve", arguments: BOOK_FLIGHT });
    assert.equal(a.structuredContent.state, "succeeded", JSON.stringify(a));
    const b = await client.callTool({ name: "flights.reserve", arguments: BOOK_FLIGHT });
    assert.equal(b.structuredContent.deduplicated, true);
    assert.equal(effects(w.providers.ledger, "flights", "reserve").length, 1);
    await client.callTool({ name: "hotels.book", arguments: BOOK_HOTEL });
    const rb = await client.callTool({ name: "idem_rollback", arguments: {} });
    assert.equal(rb.structuredContent.state, "compensated", JSON.stringify(rb));
    assert.equal(effects(w.providers.ledger, "flights", "cancel").length, 1);
    assert.equal(effects(w.providers.ledger, "hotels", "cancel").length, 1);
    assert.ok(ledgerClean(w.providers.ledger));
    await client.close();
  } finally {
    await w.stop();
  }
});

test("over stdio: stdout carries only JSON-RPC, a bad line is a parse error, EOF exits 0", async () => {
  const w = await world("raw");
  try {
    const init = { jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } };
    const r = await runStdioRaw(["--log-level", "debug", ...w.args], [
      JSON.stringify({ jsonrpc: "2.0", id: 0, method: "tools/list" }),
      JSON.stringify(init),
      JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }),
      "{this is not json",
      JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/list" }),
      JSON.stringify({ jsonrpc: "2.0", id: 3, method: "ping" }),
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.ok(r.stdout.length >= 5, r.stdout.join("\n"));
    const msgs = r.stdout.map((l) => JSON.parse(l));
    for (const m of msgs) assert.equal(m.jsonrpc, "2.0", JSON.stringify(m));
    const by = Object.fromEntries(msgs.filter((m) => m.id !== null && m.id !== undefined).map((m) => [m.id, m]));
    assert.equal(by[0].error.code, -32600, "tools/list before initialize is refused");
    assert.equal(by[1].result.protocolVersion, "2025-06-18");
    assert.ok(msgs.some((m) => m.id === null && m.error.code === -32700), "the bad line: a parse error");
    assert.ok(by[2].result.tools.length > 3, "and the process went on");
    assert.deepEqual(by[3].result, {});
    assert.ok(r.stderr.length > 0, "logs go to stderr");
  } finally {
    await w.stop();
  }
});
