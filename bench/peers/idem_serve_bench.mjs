// The server path of idem in `make bench-peers`: submit-and-wait of a
// three-step saga of loopback HTTP no-op tools against a running `idem
// serve` (POST /v1/sagas with an Idempotency-Key and `Prefer: wait=30`),
// in the closed loop of loop.mjs.
//
//   node idem_serve_bench.mjs --url http://127.0.0.1:P --token T --spec FILE
//                             [--conc 1,16,64] [--warm S] [--dur S]
import { readFileSync } from "node:fs";
import { args, closedLoop } from "./loop.mjs";

const a = args(process.argv);
for (const k of ["url", "token", "spec"]) {
  if (!a[k]) throw new Error(`idem_serve_bench: --${k} is required`);
}
const spec = JSON.parse(readFileSync(a.spec, "utf8"));
const run = `${Date.now()}`;
// A 202 (the wait ended before the saga did) is asked again with the same
// key: the stored answer, and a new wait.
const submit = async (i) => {
  const deadline = performance.now() + 60_000;
  for (;;) {
    const r = await fetch(`${a.url}/v1/sagas`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${a.token}`,
        "content-type": "application/json",
        "idempotency-key": `bench-${run}-${i}`,
        prefer: "wait=30",
      },
      body: JSON.stringify({ spec, input: { n: i } }),
    });
    const text = await r.text();
    let body;
    try {
      body = JSON.parse(text);
    } catch {
      throw new Error(`idem answered ${r.status}: ${text.slice(0, 80)}`);
    }
    if (r.status === 202 && performance.now() < deadline) continue;
    if (r.status !== 201 && r.status !== 200) {
      throw new Error(`idem answered ${r.status}: ${body.state || body.title || r.status}`);
    }
    if (body.state !== "succeeded") throw new Error(`saga ${body.saga_id} is ${body.state}`);
    return;
  }
};
for (const c of a.conc) await closedLoop("idem-serve", c, a.warm, a.dur, submit);
