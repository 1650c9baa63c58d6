// Restate (its TypeScript SDK, against the restate-server that run.sh
// started) in `make bench-peers`: a service handler of three `ctx.run`
// steps, each journaled by the server before the next one starts (Restate's
// default), called through the ingress over loopback HTTP in the closed loop
// of loop.mjs.
//
//   node restate_bench.mjs --ingress URL --admin URL --port P [--tool URL]
//                          [--system NAME] [--conc 1,16,64] [--warm S] [--dur S]
//
// With --tool, each step is a POST of {} to that loopback no-op HTTP tool
// (the server path, beside `idem serve`'s); without, each step is a no-op.
import "./polyfill.mjs";
import * as restate from "@restatedev/restate-sdk";
import { args, closedLoop } from "./loop.mjs";

const a = args(process.argv);
for (const k of ["ingress", "admin", "port"]) {
  if (!a[k]) throw new Error(`restate_bench: --${k} is required`);
}
const tool = a.tool;
const step = tool
  ? async () => {
      const r = await fetch(tool, { method: "POST", body: "{}", headers: { "content-type": "application/json" } });
      if (!r.ok) throw new Error(`tool answered ${r.status}`);
      return await r.json();
    }
  : async () => ({});

const bench3 = restate.service({
  name: "bench3",
  handlers: {
    run: async (ctx, n) => {
      await ctx.run("s1", step);
      await ctx.run("s2", step);
      await ctx.run("s3", step);
      return n;
    },
  },
});

const port = await restate.serve({ services: [bench3], port: Number(a.port) });
// Register the endpoint with the server (its admin API), then call it.
const reg = await fetch(`${a.admin}/deployments`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ uri: `http://127.0.0.1:${port}`, force: true }),
});
if (!reg.ok) throw new Error(`restate: registering the endpoint: ${reg.status} ${await reg.text()}`);

const call = async (i) => {
  const r = await fetch(`${a.ingress}/bench3/run`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(i),
  });
  if (!r.ok) throw new Error(`ingress answered ${r.status}: ${await r.text()}`);
  await r.arrayBuffer();
};
for (const c of a.conc) await closedLoop(a.system || "restate", c, a.warm, a.dur, call);
process.exit(0);
