// The table of `make bench-peers`: per system and concurrency the medians
// over the rounds of steps/s and of the saga's p50/p99 latency, and idem's
// ratio to the faster peer (steps/s; p99: the faster peer's over idem's, so
// above 1 is idem ahead). The library path compares idem-sqlite and idem-pg
// with dbos and restate; the server path idem-serve with restate-http.
//
//   node summarize.mjs rounds.jsonl
import { readFileSync } from "node:fs";

const rows = readFileSync(process.argv[2], "utf8")
  .split("\n")
  .filter((l) => l.startsWith("{"))
  .map((l) => JSON.parse(l));
const median = (v) => {
  const s = [...v].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const by = new Map();
for (const r of rows) {
  const k = `${r.system}@${r.conc}`;
  if (!by.has(k)) by.set(k, []);
  by.get(k).push(r);
}
const stat = (system, conc) => {
  const rs = by.get(`${system}@${conc}`) || [];
  return {
    n: rs.length,
    steps: median(rs.map((r) => r.steps_per_s)),
    p50: median(rs.map((r) => r.saga_p50_ms)),
    p99: median(rs.map((r) => r.saga_p99_ms)),
    errors: rs.reduce((a, r) => a + (r.errors || 0), 0),
  };
};
const fmt = (v, d = 1) => (Number.isFinite(v) ? v.toFixed(d) : "-");
const concs = [...new Set(rows.map((r) => r.conc))].sort((a, b) => a - b);
const out = [];
const rounds = Math.max(0, ...[...by.values()].map((v) => v.length));
out.push(`bench-peers: medians of ${rounds} round(s); saga latency = three steps, submit to done`);
out.push(
  `${"system".padEnd(14)} ${"C".padStart(3)} ${"steps/s".padStart(9)} ${"p50 ms".padStart(8)} ${"p99 ms".padStart(8)} ${"errors".padStart(6)} | ${"vs faster peer: steps/s".padEnd(24)} ${"p99 (peer/idem)".padEnd(16)}`,
);
out.push("-".repeat(100));
const groups = [
  { idem: ["idem-sqlite", "idem-pg"], peers: ["dbos", "restate"] },
  { idem: ["idem-serve"], peers: ["restate-http"] },
];
for (const g of groups) {
  for (const c of concs) {
    const peerStats = g.peers.map((p) => ({ p, ...stat(p, c) })).filter((s) => s.n > 0);
    const faster = peerStats.reduce((a, b) => (a && a.steps >= b.steps ? a : b), null);
    for (const sys of [...g.idem, ...g.peers]) {
      const s = stat(sys, c);
      if (s.n === 0) continue;
      let vs = "";
      let p99 = "";
      if (g.idem.includes(sys) && faster) {
        vs = `${fmt(s.steps / faster.steps, 2)}x (${faster.p})`;
        p99 = `${fmt(faster.p99 / s.p99, 2)}x`;
      }
      out.push(
        `${sys.padEnd(14)} ${String(c).padStart(3)} ${fmt(s.steps).padStart(9)} ${fmt(s.p50, 2).padStart(8)} ${fmt(s.p99, 2).padStart(8)} ${String(s.errors).padStart(6)} | ${vs.padEnd(24)} ${p99}`,
      );
    }
  }
  out.push("-".repeat(100));
}
console.log(out.join("\n"));
