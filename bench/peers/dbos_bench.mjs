// DBOS Transact (TypeScript SDK) in `make bench-peers`: a workflow of three
// no-op steps, each checkpointed in the system database (PostgreSQL) as DBOS
// does by default, driven in the closed loop of loop.mjs at each
// concurrency.
//
//   node dbos_bench.mjs --url postgresql://... [--conc 1,16,64] [--warm S] [--dur S]
import { DBOS } from "@dbos-inc/dbos-sdk";
import { args, closedLoop } from "./loop.mjs";

const a = args(process.argv);
if (!a.url) throw new Error("dbos_bench: --url is required");

const noop = async () => ({});
const bench3 = DBOS.registerWorkflow(
  async (n) => {
    await DBOS.runStep(noop, { name: "s1" });
    await DBOS.runStep(noop, { name: "s2" });
    await DBOS.runStep(noop, { name: "s3" });
    return n;
  },
  { name: "bench3" },
);

DBOS.setConfig({ name: "idem-bench-dbos", systemDatabaseUrl: a.url, logLevel: "error" });
await DBOS.launch();
try {
  for (const c of a.conc) await closedLoop("dbos", c, a.warm, a.dur, (i) => bench3(i));
} finally {
  await DBOS.shutdown();
}
