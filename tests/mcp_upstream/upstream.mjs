// A small MCP server with a durable ledger: the upstream of idem's gateway
// tests (tests/mcp_client_test.cc, tests/mcp_gateway_test.cc,
// tests/mcp/gateway*.test.mjs). Written on the official TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in this folder's package-lock.json).
//
//   node upstream.mjs --ledger FILE [--delay-ms N] [--http PORT] [--version V]
//
// stdio by default; with --http PORT, Streamable HTTP on 127.0.0.1:PORT/mcp
// (sessions by Mcp-Session-Id; it prints "listening PORT" on stdout once
// bound). --version makes it answer initialize with that protocol version
// (to test a client's refusal).
//
// The ledger: one JSON line per event, appended and fsynced before the tool
// answers, so that a SIGKILL of the upstream or of the gateway cannot lose a
// record: {"kind":"begin"|"effect"|"undo","tool","key","args","pid","at"}.
// "begin" is written when a write starts (after it the write is in flight:
// the test kills the gateway then), "effect" when it took effect. Tests count
// "effect" lines.
//
// Tools (one of each kind the gateway must tell apart):
//   get_value       readOnlyHint                   reads a value (no ledger line)
//   set_value       idempotentHint, !destructive   sets name=value (an effect line)
//   send_keyed      destructiveHint: false         a write that honours
//                                                  _meta["io.idem/idempotency-key"]:
//                                                  a key seen in the ledger answers
//                                                  the first result, no new effect
//   send_unkeyed    (no annotations)               a write that ignores keys
//   cancel_send     (no annotations)               the compensation of the sends
//   send_status     readOnlyHint                   {"status":"applied","result"}
//                                                  or {"status":"not_applied"} for a key
//   fail_always     readOnlyHint                   answers isError: true
// --delay-ms N makes send_keyed and send_unkeyed wait N ms between their
// "begin" and "effect" lines.

import fs from 'node:fs';
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { InitializeRequestSchema, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

function flag(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}
const ledgerPath = flag('--ledger', '');
if (!ledgerPath) {
  process.stderr.write('upstream: --ledger FILE is required\n');
  process.exit(2);
}
const delayMs = Number(flag('--delay-ms', '0'));
const httpPort = flag('--http', '');
const forcedVersion = flag('--version', '');

function append(record) {
  const line = JSON.stringify({ ...record, pid: process.pid, at: Date.now() }) + '\n';
  const fd = fs.openSync(ledgerPath, 'a');
  try {
    fs.writeSync(fd, line);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

function readLedger() {
  let text = '';
  try {
    text = fs.readFileSync(ledgerPath, 'utf8');
  } catch {
    return [];
  }
  return text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l));
}

const values = new Map();
let inFlight = 0;
let stdinEnded = false;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const keyOf = (extra) => extra?._meta?.['io.idem/idempotency-key'] ?? null;
const answer = (obj) => ({ content: [{ type: 'text', text: JSON.stringify(obj) }], structuredContent: obj });

async function write(tool, args, key, honoursKey) {
  if (honoursKey && key) {
    const seen = readLedger().find((r) => r.kind === 'effect' && r.tool === tool && r.key === key);
    if (seen) return answer({ ...seen.result, replayed: true });
  }
  inFlight++;
  try {
    append({ kind: 'begin', tool, key, args });
    if (delayMs > 0) await sleep(delayMs);
    const result = { id: `${tool}-${randomUUID().slice(0, 8)}`, to: args.to, body: args.body };
    append({ kind: 'effect', tool, key, args, result });
    return answer(result);
  } finally {
    inFlight--;
    if (stdinEnded && inFlight === 0) setTimeout(() => process.exit(0), 10);
  }
}

function newServer() {
  const server = new McpServer({ name: 'idem-test-upstream', version: '1.0.0' });
  const sendArgs = { to: z.string(), body: z.string().optional() };
  server.registerTool(
    'get_value',
    { description: 'Reads a value', inputSchema: { name: z.string() }, annotations: { readOnlyHint: true } },
    async ({ name }) => answer({ name, value: values.get(name) ?? null }),
  );
  server.registerTool(
    'set_value',
    {
      description: 'Sets a value (a natural SET)',
      inputSchema: { name: z.string(), value: z.string() },
      annotations: { idempotentHint: true, destructiveHint: false },
    },
    async ({ name, value }, extra) => {
      values.set(name, value);
      append({ kind: 'effect', tool: 'set_value', key: keyOf(extra), args: { name, value } });
      return answer({ name, value });
    },
  );
  server.registerTool(
    'send_keyed',
    {
      description: 'Sends a message; honours io.idem/idempotency-key',
      inputSchema: sendArgs,
      annotations: { destructiveHint: false },
    },
    async (args, extra) => write('send_keyed', args, keyOf(extra), true),
  );
  server.registerTool(
    'send_unkeyed',
    { description: 'Sends a message; ignores keys', inputSchema: sendArgs },
    async (args, extra) => write('send_unkeyed', args, keyOf(extra), false),
  );
  server.registerTool(
    'cancel_send',
    { description: 'Recalls a sent message', inputSchema: { id: z.string() } },
    async ({ id }, extra) => {
      append({ kind: 'undo', tool: 'cancel_send', key: keyOf(extra), args: { id } });
      return answer({ cancelled: id });
    },
  );
  server.registerTool(
    'send_status',
    {
      description: 'Was a send under this key applied?',
      inputSchema: { key: z.string() },
      annotations: { readOnlyHint: true },
    },
    async ({ key }) => {
      const seen = readLedger().find(
        (r) => r.kind === 'effect' && r.key === key && r.tool.startsWith('send_'),
      );
      return answer(seen ? { status: 'applied', result: seen.result } : { status: 'not_applied' });
    },
  );
  server.registerTool(
    'fail_always',
    { description: 'Always fails', inputSchema: {}, annotations: { readOnlyHint: true } },
    async () => ({ content: [{ type: 'text', text: 'this tool always fails' }], isError: true }),
  );
  if (forcedVersion) {
    // Answer initialize with a version of the test's choosing.
    const inner = server.server;
    inner.setRequestHandler(
      InitializeRequestSchema,
      async () => ({
        protocolVersion: forcedVersion,
        capabilities: { tools: {} },
        serverInfo: { name: 'idem-test-upstream', version: '1.0.0' },
      }),
    );
  }
  return server;
}

if (!httpPort) {
  const server = newServer();
  process.stdin.on('end', () => {
    stdinEnded = true;
    if (inFlight === 0) setTimeout(() => process.exit(0), 10);
  });
  await server.connect(new StdioServerTransport());
} else {
  const transports = new Map();
  const httpServer = http.createServer(async (req, res) => {
    if (!req.url.startsWith('/mcp')) {
      res.writeHead(404).end();
      return;
    }
    let body;
    if (req.method === 'POST') {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        res.writeHead(400, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error' } }));
        return;
      }
    }
    const sid = req.headers['mcp-session-id'];
    let transport = sid ? transports.get(sid) : undefined;
    if (!transport) {
      if (sid || req.method !== 'POST' || !isInitializeRequest(body)) {
        res.writeHead(sid ? 404 : 400, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'No valid session' } }));
        return;
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => transports.set(id, transport),
      });
      transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
      await newServer().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  });
  httpServer.listen(Number(httpPort), '127.0.0.1', () => {
    process.stdout.write(`listening ${httpServer.address().port}\n`);
  });
}
