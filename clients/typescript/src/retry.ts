// The retry policy of the idem client: how often and how long a request
// that is safe to repeat (a GET, a POST with an Idempotency-Key, an
// open-saga call with its call_id) is sent again after a network error, a
// 503 or 429, or a 409 idempotency-key-in-flight / saga-busy. The request
// is sent again byte for byte: the same key, the same call_id, the same
// body. A POST that carries no key is never retried.

/** Reported before each retry (for logs and tests). */
export interface RetryEvent {
  method: string;
  path: string;
  /** The attempt that failed, from 1. */
  attempt: number;
  /** The Idempotency-Key or call_id the retry reuses, if any. */
  key: string | undefined;
  error: Error;
  delayMs: number;
}

export interface RetryOptions {
  /** Attempts in all, the first included (default 6; 1 = never retry). */
  attempts?: number;
  /** The first backoff (default 250 ms); doubled each retry, with jitter. */
  baseDelayMs?: number;
  /** The longest wait between attempts, Retry-After included (default 4000 ms). */
  maxDelayMs?: number;
  onRetry?: (event: RetryEvent) => void;
}

export interface ResolvedRetry {
  attempts: number;
  baseDelayMs: number;
  maxDelayMs: number;
  onRetry: ((event: RetryEvent) => void) | undefined;
}

export function resolveRetry(retry: RetryOptions | false | undefined): ResolvedRetry {
  if (retry === false) return { attempts: 1, baseDelayMs: 0, maxDelayMs: 0, onRetry: undefined };
  const attempts = Math.max(1, Math.floor(retry?.attempts ?? 6));
  const baseDelayMs = Math.max(0, retry?.baseDelayMs ?? 250);
  const maxDelayMs = Math.max(baseDelayMs, retry?.maxDelayMs ?? 4000);
  return { attempts, baseDelayMs, maxDelayMs, onRetry: retry?.onRetry };
}

/**
 * The wait before retry number `attempt` (1 = the first retry): exponential
 * with "equal jitter" (half fixed, half random), at least the server's
 * Retry-After, at most maxDelayMs.
 */
export function backoffMs(policy: ResolvedRetry, attempt: number, retryAfterSeconds?: number): number {
  const exp = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (attempt - 1));
  const jittered = exp / 2 + Math.random() * (exp / 2);
  const floor = retryAfterSeconds === undefined ? 0 : retryAfterSeconds * 1000;
  return Math.min(policy.maxDelayMs, Math.max(jittered, floor));
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
