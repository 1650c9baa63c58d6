// idem as an MCP server over Streamable HTTP (/mcp on `idem serve`), driven
// by the official TypeScript SDK client: negotiation, the tool list and its
// annotations, journaled calls (a repeat makes one effect in the providers'
// ledger), a charge that waits for a person and is approved through the
// REST API, and rollback through idem_rollback.

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  BOOK_FLIGHT,
  BOOK_HOTEL,
  CHARGE,
  approvals,
  approve,
  authFile,
  cleanup,
  effects,
  httpClient,
  ledgerClean,
  mcpToolsFile,
  startProviders,
  startServer,
  tempDir,
} from "./mcp_helpers.mjs";

async function world(name) {
  const dir = tempDir(`mcp-http-${name}`);
  const providers = await startProviders(dir);
  const auth = authFile(dir);
  const server = await startServer(dir, { tools: mcpToolsFile(dir, providers.port), auth: auth.file });
  return {
    dir,
    providers,
    server,
    tokens: auth.tokens,
    async stop() {
      await server.stop();
      await providers.stop();
      cleanup(dir);
    },
  };
}

test("initialize negotiates 2025-11-25 and lists tools with idem's annotations", async () => {
  const w = await world("list");
  try {
    const { client, transport } = await httpClient(w.server, w.tokens.agent);
    assert.equal(client.getServerVersion().name, "idem");
    assert.equal(transport.protocolVersion, "2025-11-25");
    assert.ok(transport.sessionId, "a session id was issued");
    assert.deepEqual(client.getServerCapabilities().tools, { listChanged: false });
    await client.ping();
    const { tools } = await client.listTools();
    const by = Object.fromEntries(tools.map((t) => [t.name, t]));
    for (const n of ["flights.reserve", "hotels.book", "payments.charge", "idem_commit", "idem_rollback"]) {
      assert.ok(by[n], `${n} is listed`);
    }
    assert.deepEqual(
      { ...by["hotels.book"].annotations, title: undefined },
      { title: undefined, readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: true },
    );
    assert.equal(by["flights.cancel"].annotations.destructiveHint, true, "nothing undoes a cancel");
    assert.equal(by["idem_rollback"].annotations.destructiveHint, true);
    assert.equal(by["idem_commit"].annotations.openWorldHint, false);
    await client.close();
  } finally {
    await w.stop();
  }
});

test("a repeated call makes one effect; a charge waits for a person, is approved through the API, then completes", async () => {
  const w = await world("approve");
  try {
    const { client } = await httpClient(w.server, w.tokens.agent);
    const first = await client.callTool({ name: "hotels.book", arguments: BOOK_HOTEL });
    assert.equal(first.isError, false, JSON.stringify(first));
    assert.equal(first.structuredContent.state, "succeeded");
    const again = await client.callTool({ name: "hotels.book", arguments: BOOK_HOTEL });
    assert.equal(again.structuredContent.deduplicated, true);
    assert.deepEqual(again.structuredContent.result, first.structuredContent.result);
    assert.equal(effects(w.providers.ledger, "hotels", "book").length, 1, "one booking for two calls");

    const waiting = await client.callTool({ name: "payments.charge", arguments: CHARGE });
    assert.equal(waiting.isError, false, JSON.stringify(waiting));
    const sc = waiting.structuredContent;
    assert.equal(sc.status, "awaiting_approval");
    assert.ok(sc.saga_id && sc.call_id && sc.summary, JSON.stringify(sc));
    assert.match(sc.approve_at.api, /\/v1\/approvals/);
    assert.equal(sc.approve_at.ui, `/ui/approvals/${sc.saga_id}/${sc.step_id}`);
    assert.equal(sc.token, undefined, "the agent never sees the commit token");
    assert.equal(waiting._meta["io.idem/saga"].saga_id, sc.saga_id);
    assert.equal(effects(w.providers.ledger, "payments", "charge").length, 0);

    const list = await approvals(w.server, w.tokens.approver, 1);
    assert.equal(list.length, 1);
    assert.equal(list[0].saga_id, sc.saga_id);
    const ok = await approve(w.server, w.tokens.approver, list[0].token);
    assert.equal(ok.status, 200, JSON.stringify(ok.body));

    const done = await client.callTool({ name: "payments.charge", arguments: CHARGE });
    assert.equal(done.structuredContent.state, "succeeded", JSON.stringify(done));
    assert.equal(effects(w.providers.ledger, "payments", "charge").length, 1);
    const committed = await client.callTool({ name: "idem_commit", arguments: {} });
    assert.equal(committed.structuredContent.state, "succeeded", JSON.stringify(committed));
    assert.ok(ledgerClean(w.providers.ledger));
    await client.close();
  } finally {
    await w.stop();
  }
});

test("idem_rollback compensates the session's calls in reverse order", async () => {
  const w = await world("rollback");
  try {
    const { client } = await httpClient(w.server, w.tokens.agent);
    assert.equal((await client.callTool({ name: "flights.reserve", arguments: BOOK_FLIGHT })).structuredContent.state, "succeeded");
    assert.equal((await client.callTool({ name: "hotels.book", arguments: BOOK_HOTEL })).structuredContent.state, "succeeded");
    const rb = await client.callTool({ name: "idem_rollback", arguments: { reason: "Ada cancelled" } });
    assert.equal(rb.isError, false, JSON.stringify(rb));
    assert.equal(rb.structuredContent.state, "compensated");
    assert.equal(effects(w.providers.ledger, "flights", "cancel").length, 1);
    assert.equal(effects(w.providers.ledger, "hotels", "cancel").length, 1);
    const after = await client.callTool({ name: "hotels.book", arguments: BOOK_HOTEL });
    assert.equal(after.isError, true, "the saga is over");
    assert.equal(effects(w.providers.ledger, "hotels", "book").length, 1);
    assert.ok(ledgerClean(w.providers.ledger));
    await client.close();
  } finally {
    await w.stop();
  }
});

test("an unknown tool is a JSON-RPC error; a caller without a token is refused", async () => {
  const w = await world("errors");
  try {
    const { client } = await httpClient(w.server, w.tokens.agent);
    await assert.rejects(client.callTool({ name: "nope.do", arguments: {} }), /Unknown tool/);
    await client.close();
    await assert.rejects(httpClient(w.server, undefined), /401|Unauthorized|authoriz/i);
  } finally {
    await w.stop();
  }
});
