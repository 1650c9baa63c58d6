// A Streamable HTTP front for `idem mcp` over stdio, so that the MCP
// conformance suite (which tests servers by URL) can test the stdio
// transport: each HTTP session is one `idem mcp` process, and every message
// is carried to its stdin and back from its stdout unchanged, one line each.
// A request is answered as an SSE stream: the progress notifications for its
// progressToken, then its response. Lines on stdout that are not JSON-RPC
// are counted and fail the run (stdout must carry protocol messages only).
//
// Usage: node stdio_bridge.mjs PORT DIR IDEM_BIN ARGS...  (an argument @DB@
// becomes a journal file of the session's own in DIR: on SQLite each
// `idem mcp` holds its journal's driver lock)
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import http from "node:http";
import path from "node:path";
import readline from "node:readline";

const [port, dir, bin, ...args] = process.argv.slice(2);
const sessions = new Map();
let started = 0;
let badLines = 0;

function child() {
  const db = path.join(dir, `session-${++started}.db`);
  const proc = spawn(bin, args.map((a) => (a === "@DB@" ? db : a)), { stdio: ["pipe", "pipe", "inherit"] });
  const pending = new Map(); // request id (JSON text) -> {res, token}
  readline.createInterface({ input: proc.stdout }).on("line", (line) => {
    let m;
    try {
      m = JSON.parse(line);
    } catch {
      badLines++;
      console.error(`stdio_bridge: not JSON on stdout: ${line}`);
      return;
    }
    if (m.jsonrpc !== "2.0") {
      badLines++;
      console.error(`stdio_bridge: not JSON-RPC on stdout: ${line}`);
      return;
    }
    if (m.method) {
      const token = m.params?.progressToken;
      for (const p of pending.values()) {
        if (token !== undefined && p.token === token) p.res.write(`event: message\ndata: ${line}\n\n`);
      }
      return;
    }
    const key = JSON.stringify(m.id);
    const p = pending.get(key);
    if (!p) return;
    pending.delete(key);
    p.res.end(`event: message\ndata: ${line}\n\n`);
  });
  return { proc, pending };
}

function send(res, status, body, headers = {}) {
  res.writeHead(status, { "Content-Type": "application/json", ...headers });
  res.end(body === undefined ? undefined : JSON.stringify(body));
}

http
  .createServer((req, res) => {
    if (req.url !== "/mcp") return send(res, 404, { error: "not found" });
    if (req.method === "GET") return send(res, 405, { jsonrpc: "2.0", id: null, error: { code: -32600, message: "no stream" } }, { Allow: "POST, DELETE" });
    const sid = req.headers["mcp-session-id"];
    if (req.method === "DELETE") {
      const s = sessions.get(sid);
      if (!s) return send(res, 404);
      s.proc.stdin.end();
      sessions.delete(sid);
      return send(res, 200);
    }
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      let m;
      try {
        m = JSON.parse(body);
      } catch {
        return send(res, 400, { jsonrpc: "2.0", id: null, error: { code: -32700, message: "Parse error" } });
      }
      let s;
      let headers = {};
      if (m.method === "initialize") {
        const id = randomUUID();
        s = child();
        sessions.set(id, s);
        headers = { "Mcp-Session-Id": id };
      } else {
        if (!sid) return send(res, 400, { jsonrpc: "2.0", id: null, error: { code: -32600, message: "Mcp-Session-Id required" } });
        s = sessions.get(sid);
        if (!s) return send(res, 404, { jsonrpc: "2.0", id: null, error: { code: -32600, message: "Session not found" } });
      }
      const line = JSON.stringify(m);
      if (m.id === undefined || m.method === undefined) {
        s.proc.stdin.write(line + "\n");
        return send(res, 202);
      }
      res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache", ...headers });
      s.pending.set(JSON.stringify(m.id), { res, token: m.params?._meta?.progressToken });
      s.proc.stdin.write(line + "\n");
    });
  })
  .listen(Number(port), "127.0.0.1", () => console.error(`stdio_bridge: listening on ${port}`));

function stop() {
  for (const s of sessions.values()) s.proc.stdin.end();
  if (badLines > 0) console.error(`stdio_bridge: ${badLines} stdout lines were not JSON-RPC`);
  process.exit(badLines > 0 ? 1 : 0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
