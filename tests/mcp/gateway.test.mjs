// SDK-level gateway tests (issue 15): the official TypeScript SDK's client
// -> `idem mcp --upstream '...'` -> the test upstream
// (tests/mcp_upstream/upstream.mjs) and its durable ledger.
//
//   IDEM_BIN=build/idem node --test tests/mcp/gateway.test.mjs
//
// Run by ctest (mcp_gateway_sdk) against the build's idem; `IDEM_BIN`
// defaults to build/idem. The SDK is taken from tests/mcp_upstream's own pinned
// install (npm ci there, scripts/install-deps.sh), so they do not depend
// on tests/mcp's.
//
// What they check: the upstream's tools are listed through idem; a call
// makes one effect; the same call again (same io.idem/intent and
// io.idem/call-id) makes none; the gateway process SIGKILLed while the
// upstream write is in flight, then a new gateway process and the same call:
// no second effect.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const sdk = path.join(root, 'tests/mcp_upstream/node_modules/@modelcontextprotocol/sdk/dist/esm');
const { Client } = await import(path.join(sdk, 'client/index.js'));
const { StdioClientTransport } = await import(path.join(sdk, 'client/stdio.js'));

const idem = process.env.IDEM_BIN ?? path.join(root, 'build/idem');
const upstreamScript = path.join(root, 'tests/mcp_upstream/upstream.mjs');

const config = {
  tools: {
    send_keyed: {
      honours_keys: true,
      status: { tool: 'send_status' },
      compensate: { tool: 'cancel_send', args: { id: '${result.structuredContent.id}' } },
    },
    send_unkeyed: { compensate: { tool: 'cancel_send', args: { id: '${result.structuredContent.id}' } } },
    cancel_send: { compensate: null, reason: 'a recall is not undone' },
  },
};

function workspace() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-gateway-'));
  const cfg = path.join(dir, 'gateway.json');
  fs.writeFileSync(cfg, JSON.stringify(config));
  return { dir, db: path.join(dir, 'journal.db'), ledger: path.join(dir, 'ledger.jsonl'), cfg };
}

function ledger(file, kind, tool) {
  if (!fs.existsSync(file)) return 0;
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l))
    .filter((r) => r.kind === kind && (!tool || r.tool === tool)).length;
}

async function waitFor(pred, ms) {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (pred()) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return pred();
}

async function gateway(ws, extra = '') {
  const upstream = `'${process.execPath}' '${upstreamScript}' --ledger '${ws.ledger}' ${extra}`;
  const transport = new StdioClientTransport({
    command: idem,
    args: ['mcp', '--db', ws.db, '--upstream', upstream, '--gateway-config', ws.cfg],
    stderr: 'inherit',
  });
  const client = new Client({ name: 'gateway-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
}

const meta = (intent, callId) => ({ 'io.idem/intent': intent, 'io.idem/call-id': callId });

test('the upstream tools are listed and a repeated call makes one effect', async () => {
  const ws = workspace();
  const { client } = await gateway(ws);
  try {
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name);
    for (const n of ['get_value', 'set_value', 'send_keyed', 'send_unkeyed']) {
      assert.ok(names.includes(n), `${n} in ${names}`);
    }
    const args = { name: 'send_unkeyed', arguments: { to: 'ana' }, _meta: meta('sdk-1', 'c-1') };
    const first = await client.callTool(args);
    assert.notEqual(first.isError, true, JSON.stringify(first));
    assert.equal(ledger(ws.ledger, 'effect', 'send_unkeyed'), 1);
    const again = await client.callTool(args);
    assert.notEqual(again.isError, true, JSON.stringify(again));
    assert.equal(ledger(ws.ledger, 'effect', 'send_unkeyed'), 1);
    assert.equal(ledger(ws.ledger, 'begin', 'send_unkeyed'), 1);
  } finally {
    await client.close();
  }
});

test('the gateway SIGKILLed mid-write, then the same call after restart: no second effect', async () => {
  const ws = workspace();
  const killed = await gateway(ws, '--delay-ms 3000');
  const call = { name: 'send_keyed', arguments: { to: 'bo' }, _meta: meta('sdk-crash', 'c-1') };
  const pending = killed.client.callTool(call).then(
    () => 'answered',
    () => 'lost',
  );
  assert.ok(await waitFor(() => ledger(ws.ledger, 'begin', 'send_keyed') === 1, 20_000));
  process.kill(killed.transport.pid, 'SIGKILL');
  assert.equal(await pending, 'lost');
  // The orphaned upstream finishes the write it had begun.
  assert.ok(await waitFor(() => ledger(ws.ledger, 'effect', 'send_keyed') === 1, 10_000));

  const { client } = await gateway(ws);
  try {
    const retried = await client.callTool(call);
    assert.notEqual(retried.isError, true, JSON.stringify(retried));
    assert.equal(ledger(ws.ledger, 'effect', 'send_keyed'), 1);
    assert.equal(ledger(ws.ledger, 'begin', 'send_keyed'), 1);
  } finally {
    await client.close();
  }
});
