// The closed loop of `make bench-peers` (bench/peers/run.sh), the same as
// idem-bench's: `conc` workers each run one three-step saga after another;
// sagas finishing in the counted window (after a warm-up) are counted. One
// JSON line per run on stdout: steps/s and the saga's p50/p99 latency.

export function quantile(sorted, q) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

export function args(argv) {
  const out = { conc: [1, 16, 64], warm: 0.7, dur: 2.0 };
  for (let i = 2; i < argv.length; i += 2) {
    const [k, v] = [argv[i], argv[i + 1]];
    if (v === undefined) throw new Error(`missing value after ${k}`);
    if (k === "--conc") out.conc = v.split(",").map(Number);
    else if (k === "--warm") out.warm = Number(v);
    else if (k === "--dur") out.dur = Number(v);
    else out[k.replace(/^--/, "")] = v;
  }
  return out;
}

// Runs `saga(i)` (a promise of one three-step saga) in a closed loop.
export async function closedLoop(system, conc, warmS, durS, saga) {
  let phase = 0; // 0 warm-up, 1 counted, 2 stop
  let sagas = 0;
  let errors = 0;
  let firstError = "";
  const lat = [];
  let next = 0;
  const worker = async () => {
    while (phase < 2) {
      const i = next++;
      const t0 = performance.now();
      try {
        await saga(i);
        if (phase === 1) {
          sagas += 1;
          lat.push(performance.now() - t0);
        }
      } catch (e) {
        if (phase === 1 && errors++ === 0) firstError = String(e && e.message ? e.message : e);
      }
    }
  };
  const workers = Array.from({ length: conc }, worker);
  await new Promise((r) => setTimeout(r, warmS * 1000));
  const t0 = performance.now();
  phase = 1;
  await new Promise((r) => setTimeout(r, durS * 1000));
  phase = 2;
  const secs = (performance.now() - t0) / 1000;
  await Promise.all(workers);
  lat.sort((a, b) => a - b);
  const line = {
    system,
    conc,
    steps_per_s: (3 * sagas) / secs,
    saga_p50_ms: quantile(lat, 0.5),
    saga_p99_ms: quantile(lat, 0.99),
    sagas,
    errors,
  };
  if (errors > 0) line.first_error = firstError;
  console.log(JSON.stringify(line));
  return line;
}
