// idem as an MCP server over stdio on PostgreSQL, beside `idem serve` on the
// same journal: a charge made through `idem mcp` waits for a person, is
// approved through the REST API of the server, and the repeated call then
// answers the outcome; the providers' ledger has one charge. Needs the
// ctest `postgres` fixture (IDEM_MCP_PG_URL, set by tests/mcp/run.sh).

import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import {
  CHARGE,
  approvals,
  approve,
  authFile,
  cleanup,
  effects,
  ledgerClean,
  mcpToolsFile,
  startProviders,
  startServerOn,
  stdioClient,
  tempDir,
} from "./mcp_helpers.mjs";

const PG = process.env.IDEM_MCP_PG_URL;

test("over stdio on PostgreSQL: a charge approved through the REST API completes", { skip: !PG && "no IDEM_MCP_PG_URL" }, async () => {
  const dir = tempDir("mcp-stdio-pg");
  const providers = await startProviders(dir);
  const tools = mcpToolsFile(dir, providers.port);
  const keys = path.join(dir, "keys.json");
  const auth = authFile(dir);
  const server = await startServerOn(PG, { tools, auth: auth.file, keys });
  let client;
  try {
    ({ client } = await stdioClient(["--db", PG, "--keys", keys, "mcp", "--tools", tools]));
    const waiting = await client.callTool({ name: "payments.charge", arguments: CHARGE });
    assert.equal(waiting.structuredContent.status, "awaiting_approval", JSON.stringify(waiting));
    assert.match(waiting.structuredContent.approve_at.cli, /\$IDEM_DB/, "no database URL in the hint");
    const list = await approvals(server, auth.tokens.approver, 1);
    const mine = list.find((a) => a.saga_id === waiting.structuredContent.saga_id);
    assert.ok(mine, JSON.stringify(list));
    const ok = await approve(server, auth.tokens.approver, mine.token);
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    const done = await client.callTool({ name: "payments.charge", arguments: CHARGE });
    assert.equal(done.structuredContent.state, "succeeded", JSON.stringify(done));
    assert.equal(effects(providers.ledger, "payments", "charge").length, 1);
    assert.ok(ledgerClean(providers.ledger));
  } finally {
    if (client) await client.close();
    await server.stop();
    await providers.stop();
    cleanup(dir);
  }
});
