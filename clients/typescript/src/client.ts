// IdemClient: the idem REST API (/v1, server/openapi.json) over the
// platform's fetch. One method per endpoint; errors are typed (errors.ts);
// requests that are safe to repeat are retried with the same key
// (retry.ts). Nothing here logs, and the bearer token only ever goes into
// the Authorization header.

import { IdemError, errorFromResponse, networkError } from "./errors.js";
import { type RetryEvent, type RetryOptions, type ResolvedRetry, backoffMs, resolveRetry, sleep } from "./retry.js";
import {
  type Approval,
  type BeginRequest,
  type CallAnswer,
  type CallRequest,
  type CommitAnswer,
  type ControlledSaga,
  type ModelDecision,
  type OpenSaga,
  type Resolution,
  type RollbackAnswer,
  type Saga,
  type SagaList,
  type SagaState,
  type SpecVersion,
  type SubmitRequest,
} from "./types.js";
import { BUSY_PROBLEMS, FINAL_SAGA_STATES } from "./vocabulary.js";

export interface IdemClientOptions {
  /** The server, e.g. "http://127.0.0.1:8080" (the client adds /v1). */
  baseUrl: string;
  /** The caller's bearer token; omit for a server run with --insecure-no-auth. */
  token?: string;
  /** A fetch implementation (default: the global fetch). */
  fetch?: typeof fetch;
  /** Retries of requests that are safe to repeat; false: never retry. */
  retry?: RetryOptions | false;
  /** Deadline of one attempt, in ms, on top of any Prefer: wait (default 30000). */
  timeoutMs?: number;
}

/** Options every call takes. */
export interface CallOptions {
  signal?: AbortSignal;
}

/** For the requests that can wait for an outcome (RFC 7240 Prefer: wait=N). */
export interface WaitOptions extends CallOptions {
  /** Seconds the server may hold the answer for the outcome. */
  wait?: number;
}

/** An HTTP answer: its status, headers and decoded body. */
export interface IdemResponse<T> {
  status: number;
  headers: Headers;
  body: T;
}

export interface Submitted {
  saga: Saga;
  /** 201: this request recorded the saga (a replay of that answer too). */
  created: boolean;
  /** The answer was replayed from the Idempotency-Key record. */
  replayed: boolean;
  /** The server's Preference-Applied header ("wait=N" when it waited). */
  preferenceApplied: string | undefined;
}

/** How a request may be retried. */
export type RetryClass =
  /** Never sent twice (a POST without a key). */
  | { safe: false }
  /** Sent again as it is; `key` is what makes it safe, for the retry report. */
  | { safe: true; key: string | undefined };

export interface IdemRequest {
  method: "GET" | "POST" | "PUT";
  path: string;
  query?: Record<string, string | number | undefined>;
  body?: unknown;
  headers?: Record<string, string>;
  retry: RetryClass;
  wait?: number;
  signal?: AbortSignal;
  /** Told before each retry of this request (besides the client's onRetry). */
  onRetry?: (event: RetryEvent) => void;
}

/** 409s that mean "not now" (vocabulary.ts): retried like a 503 when the request is safe to repeat. */
const BUSY: ReadonlySet<string> = new Set(BUSY_PROBLEMS);

function enc(segment: string): string {
  if (typeof segment !== "string" || segment.length === 0) {
    throw new TypeError(`idem: a path segment must be a non-empty string, got ${JSON.stringify(segment)}`);
  }
  return encodeURIComponent(segment);
}

function preferWait(wait: number | undefined): Record<string, string> {
  if (wait === undefined) return {};
  if (!Number.isInteger(wait) || wait < 0) {
    throw new TypeError(`idem: wait must be a whole number of seconds >= 0, got ${wait}`);
  }
  return { Prefer: `wait=${wait}` };
}

export class IdemClient {
  readonly baseUrl: string;
  readonly #token: string | undefined;
  readonly #fetch: typeof fetch;
  readonly #retry: ResolvedRetry;
  readonly #timeoutMs: number;

  constructor(options: IdemClientOptions) {
    if (!options || typeof options.baseUrl !== "string" || !/^https?:\/\//.test(options.baseUrl)) {
      throw new TypeError("idem: IdemClient needs baseUrl, an http:// or https:// URL");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#token = options.token;
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("idem: no fetch: pass options.fetch");
    this.#fetch = f;
    this.#retry = resolveRetry(options.retry);
    this.#timeoutMs = options.timeoutMs ?? 30000;
  }

  /**
   * One request: the typed error for a non-2xx answer, retries with backoff
   * (the same request again) on a network error, 503 or 429 when the request
   * is safe to repeat. Public for endpoints this client has no method for.
   */
  async request<T>(init: IdemRequest): Promise<IdemResponse<T>> {
    let url = `${this.baseUrl}${init.path}`;
    if (init.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(init.query)) if (v !== undefined) q.set(k, String(v));
      const s = q.toString();
      if (s) url += `?${s}`;
    }
    const headers: Record<string, string> = { Accept: "application/json", ...preferWait(init.wait), ...init.headers };
    if (this.#token) headers.Authorization = `Bearer ${this.#token}`;
    let payload: string | undefined;
    if (init.body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(init.body);
    }
    const attempts = init.retry.safe ? this.#retry.attempts : 1;
    const perAttemptMs = this.#timeoutMs + (init.wait ?? 0) * 1000;
    for (let attempt = 1; ; attempt++) {
      let error: IdemError;
      try {
        const signals = [AbortSignal.timeout(perAttemptMs)];
        if (init.signal) signals.push(init.signal);
        const res = await this.#fetch(url, {
          method: init.method,
          headers,
          body: payload,
          signal: AbortSignal.any(signals),
        });
        const body = await readBody(res);
        if (res.ok) return { status: res.status, headers: res.headers, body: body as T };
        error = errorFromResponse(init.method, init.path, res.status, body, res.headers.get("Retry-After"));
      } catch (e) {
        if (init.signal?.aborted) throw init.signal.reason;
        if (e instanceof IdemError) throw e;
        error = networkError(init.method, init.path, e);
      }
      const retryable = error.kind === "network" || error.kind === "unavailable" || BUSY.has(error.problemName);
      if (!retryable || !init.retry.safe || attempt >= attempts) throw error;
      const delayMs = backoffMs(this.#retry, attempt, error.retryAfterSeconds);
      const event: RetryEvent = { method: init.method, path: init.path, attempt, key: init.retry.key, error, delayMs };
      init.onRetry?.(event);
      this.#retry.onRetry?.(event);
      await sleep(delayMs, init.signal);
    }
  }

  // ---- Health

  /** GET /healthz. */
  async health(opts: CallOptions = {}): Promise<{ status: string }> {
    return (await this.request<{ status: string }>({ method: "GET", path: "/healthz", retry: { safe: true, key: undefined }, ...opts })).body;
  }

  // ---- Spec sagas

  /**
   * POST /v1/sagas under the intent key (Idempotency-Key): the same key and
   * body again answer the same saga, so a lost answer is retried with the
   * same key; the same key with other content is an IdemError (409 or 422).
   */
  async submit(req: SubmitRequest, opts: WaitOptions & { intentKey: string }): Promise<Submitted> {
    if (!opts?.intentKey) throw new TypeError("idem: submit needs opts.intentKey (the Idempotency-Key)");
    const res = await this.request<Saga>({
      method: "POST",
      path: "/v1/sagas",
      body: req,
      headers: { "Idempotency-Key": opts.intentKey },
      retry: { safe: true, key: opts.intentKey },
      wait: opts.wait,
      signal: opts.signal,
    });
    return {
      saga: res.body,
      created: res.status === 201,
      replayed: res.headers.get("Idempotent-Replayed") === "true",
      preferenceApplied: res.headers.get("Preference-Applied") ?? undefined,
    };
  }

  /** GET /v1/sagas/{id}: the saga, its steps, effects (and an open saga's calls). */
  async getSaga(sagaId: string, opts: CallOptions = {}): Promise<Saga> {
    return (await this.#get<Saga>(`/v1/sagas/${enc(sagaId)}`, undefined, opts)).body;
  }

  /** GET /v1/sagas: the caller's sagas, newest first. */
  async listSagas(q: { status?: SagaState; limit?: number } = {}, opts: CallOptions = {}): Promise<SagaList> {
    return (await this.#get<SagaList>("/v1/sagas", { status: q.status, limit: q.limit }, opts)).body;
  }

  /**
   * Polls GET /v1/sagas/{id} until `until` holds (default: a final state),
   * every `intervalMs` (default 100), at most `timeoutMs` (default 30000).
   */
  async waitForSaga(
    sagaId: string,
    opts: CallOptions & { until?: (s: Saga) => boolean; intervalMs?: number; timeoutMs?: number } = {},
  ): Promise<Saga> {
    const until = opts.until ?? ((s: Saga) => (FINAL_SAGA_STATES as readonly SagaState[]).includes(s.state));
    const deadline = Date.now() + (opts.timeoutMs ?? 30000);
    for (;;) {
      const saga = await this.getSaga(sagaId, opts);
      if (until(saga)) return saga;
      if (Date.now() >= deadline) {
        throw new Error(`idem: saga ${sagaId} is still ${saga.state} after ${opts.timeoutMs ?? 30000} ms`);
      }
      await sleep(opts.intervalMs ?? 100, opts.signal);
    }
  }

  /** POST /v1/sagas/{id}/cancel: a durable request; the saga rolls back. */
  cancel(sagaId: string, body: { reason?: string } = {}, opts: CallOptions = {}): Promise<ControlledSaga> {
    return this.#control(sagaId, "cancel", body, opts);
  }

  /** POST /v1/sagas/{id}/pause: the saga stops between steps. */
  pause(sagaId: string, body: { reason?: string } = {}, opts: CallOptions = {}): Promise<ControlledSaga> {
    return this.#control(sagaId, "pause", body, opts);
  }

  /** POST /v1/sagas/{id}/resume: a paused saga goes on. */
  resume(sagaId: string, body: { reason?: string } = {}, opts: CallOptions = {}): Promise<ControlledSaga> {
    return this.#control(sagaId, "resume", body, opts);
  }

  /** POST /v1/sagas/{id}/resolve: a person's decision on a parked step (never retried). */
  async resolve(sagaId: string, resolution: Resolution, opts: CallOptions = {}): Promise<Saga> {
    return (
      await this.request<Saga>({
        method: "POST",
        path: `/v1/sagas/${enc(sagaId)}/resolve`,
        body: resolution,
        retry: { safe: false },
        signal: opts.signal,
      })
    ).body;
  }

  // ---- Approvals

  /** GET /v1/approvals: commits waiting for a person. */
  async approvals(opts: CallOptions = {}): Promise<Approval[]> {
    return (await this.#get<{ approvals: Approval[] }>("/v1/approvals", undefined, opts)).body.approvals;
  }

  /**
   * The approval waiting for a step (an open saga's call: its step_id), with
   * its token, or undefined (decided already, or not this caller's to see).
   * For a person's client: an agent never gets the token.
   */
  async approvalFor(sagaId: string, step: string, opts: CallOptions = {}): Promise<Approval | undefined> {
    return (await this.approvals(opts)).find((a) => a.saga_id === sagaId && a.step === step);
  }

  /** POST /v1/approvals/{token}/approve (never retried: a repeat is 409 approval-not-pending). */
  approve(token: string, body: { note?: string } = {}, opts: CallOptions = {}): Promise<Saga> {
    return this.#decide(token, "approve", body, opts);
  }

  /** POST /v1/approvals/{token}/reject: the saga rolls back (never retried). */
  reject(token: string, body: { reason: string }, opts: CallOptions = {}): Promise<Saga> {
    return this.#decide(token, "reject", body, opts);
  }

  // ---- Specs

  /** PUT /v1/specs/{name}: a new version, or the existing one with the same content (safe to repeat). */
  async putSpec(name: string, spec: Record<string, unknown>, opts: CallOptions & { shared?: boolean } = {}): Promise<SpecVersion> {
    return (
      await this.request<SpecVersion>({
        method: "PUT",
        path: `/v1/specs/${enc(name)}`,
        query: { shared: opts.shared === undefined ? undefined : String(opts.shared) },
        body: spec,
        retry: { safe: true, key: name },
        signal: opts.signal,
      })
    ).body;
  }

  /** GET /v1/specs/{name}[?version=N]. */
  async getSpec(name: string, opts: CallOptions & { version?: number } = {}): Promise<SpecVersion> {
    return (await this.#get<SpecVersion>(`/v1/specs/${enc(name)}`, { version: opts.version }, opts)).body;
  }

  /** GET /v1/specs. */
  async listSpecs(opts: CallOptions = {}): Promise<{ specs: SpecVersion[] }> {
    return (await this.#get<{ specs: SpecVersion[] }>("/v1/specs", undefined, opts)).body;
  }

  // ---- Open sagas

  /**
   * POST /v1/open-sagas: begin an intent. The intent key makes it safe to
   * repeat (the same key and body answer the same saga), so it is retried,
   * and sent as the Idempotency-Key unless another one is given.
   */
  async begin(req: BeginRequest, opts: CallOptions & { idempotencyKey?: string } = {}): Promise<OpenSagaSession> {
    if (!req?.intent_key) throw new TypeError("idem: begin needs intent_key");
    const key = opts.idempotencyKey ?? req.intent_key;
    const res = await this.request<OpenSaga>({
      method: "POST",
      path: "/v1/open-sagas",
      body: req,
      headers: { "Idempotency-Key": key },
      retry: { safe: true, key },
      signal: opts.signal,
    });
    return new OpenSagaSession(this, res.body);
  }

  /** A session for an open saga begun earlier (by id). */
  openSaga(sagaId: string): OpenSagaSession {
    return new OpenSagaSession(this, { saga_id: sagaId, state: "open", intent_key: "", tools: [] });
  }

  /**
   * POST /v1/sagas/{id}/calls: one tool call. The call_id (the model's
   * tool-call id) makes it safe to repeat: a retry after a lost answer gets
   * the recorded answer and calls nothing. 200 and 202 answers are returned
   * (see CallAnswer.state); errors are thrown.
   */
  async call(sagaId: string, req: CallRequest, opts: WaitOptions = {}): Promise<CallAnswer> {
    if (!req?.call_id) throw new TypeError("idem: a call needs call_id (the model's tool-call id)");
    const res = await this.request<CallAnswer>({
      method: "POST",
      path: `/v1/sagas/${enc(sagaId)}/calls`,
      body: req,
      retry: { safe: true, key: req.call_id },
      wait: opts.wait,
      signal: opts.signal,
    });
    return res.body;
  }

  /**
   * GET /v1/sagas/{id}/calls/{call_id}: the call's answer as it stands
   * (with `wait`, once settled or after N seconds); calls nothing.
   */
  async getCall(sagaId: string, callId: string, opts: WaitOptions = {}): Promise<CallAnswer> {
    return (
      await this.request<CallAnswer>({
        method: "GET",
        path: `/v1/sagas/${enc(sagaId)}/calls/${enc(callId)}`,
        retry: { safe: true, key: undefined },
        wait: opts.wait,
        signal: opts.signal,
      })
    ).body;
  }

  /**
   * POST /v1/sagas/{id}/commit: the open saga succeeds. Retried after a
   * lost answer; a retry that finds the saga no longer open reads it and
   * answers its state when that is the commit's outcome.
   */
  async commit(sagaId: string, body: { decision?: ModelDecision } = {}, opts: WaitOptions = {}): Promise<CommitAnswer> {
    return this.#settle(sagaId, "commit", body, ["succeeded"], opts);
  }

  /**
   * POST /v1/sagas/{id}/rollback: every completed call compensated in
   * reverse order ("compensated", or "compensating" when not done within
   * the wait). Retried like commit.
   */
  async rollback(sagaId: string, body: { reason?: string } = {}, opts: WaitOptions = {}): Promise<RollbackAnswer> {
    return this.#settle(sagaId, "rollback", body, ["compensating", "compensated"], opts);
  }

  // ---- internals

  #get<T>(path: string, query: Record<string, string | number | undefined> | undefined, opts: CallOptions) {
    return this.request<T>({ method: "GET", path, query, retry: { safe: true, key: undefined }, signal: opts.signal });
  }

  async #decide(token: string, verb: "approve" | "reject", body: object, opts: CallOptions): Promise<Saga> {
    return (
      await this.request<Saga>({
        method: "POST",
        path: `/v1/approvals/${enc(token)}/${verb}`,
        body,
        retry: { safe: false },
        signal: opts.signal,
      })
    ).body;
  }

  async #control(sagaId: string, verb: string, body: object, opts: CallOptions): Promise<ControlledSaga> {
    // A durable request: sending it again records nothing new (control.recorded false).
    return (
      await this.request<ControlledSaga>({
        method: "POST",
        path: `/v1/sagas/${enc(sagaId)}/${verb}`,
        body,
        retry: { safe: true, key: undefined },
        signal: opts.signal,
      })
    ).body;
  }

  async #settle(
    sagaId: string,
    verb: "commit" | "rollback",
    body: object,
    outcomes: SagaState[],
    opts: WaitOptions,
  ): Promise<CommitAnswer> {
    let retried = false;
    try {
      return (
        await this.request<CommitAnswer>({
          method: "POST",
          path: `/v1/sagas/${enc(sagaId)}/${verb}`,
          body,
          retry: { safe: true, key: undefined },
          wait: opts.wait,
          signal: opts.signal,
          onRetry: () => {
            retried = true;
          },
        })
      ).body;
    } catch (e) {
      // The first attempt may have done it before its answer was lost.
      if (retried && e instanceof IdemError && e.kind === "saga_not_open") {
        const saga = await this.getSaga(sagaId, opts);
        if (outcomes.includes(saga.state)) return { state: saga.state, saga_id: saga.saga_id };
      }
      throw e;
    }
  }
}

/** An open saga: call tools one at a time, then commit or roll back. */
export class OpenSagaSession {
  readonly client: IdemClient;
  readonly sagaId: string;
  /** The begin answer (state, intent key, tools, links). */
  readonly info: OpenSaga;

  constructor(client: IdemClient, info: OpenSaga) {
    this.client = client;
    this.sagaId = info.saga_id;
    this.info = info;
  }

  call(req: CallRequest, opts: WaitOptions = {}): Promise<CallAnswer> {
    return this.client.call(this.sagaId, req, opts);
  }

  getCall(callId: string, opts: WaitOptions = {}): Promise<CallAnswer> {
    return this.client.getCall(this.sagaId, callId, opts);
  }

  get(opts: CallOptions = {}): Promise<Saga> {
    return this.client.getSaga(this.sagaId, opts);
  }

  commit(body: { decision?: ModelDecision } = {}, opts: WaitOptions = {}): Promise<CommitAnswer> {
    return this.client.commit(this.sagaId, body, opts);
  }

  rollback(body: { reason?: string } = {}, opts: WaitOptions = {}): Promise<RollbackAnswer> {
    return this.client.rollback(this.sagaId, body, opts);
  }

  cancel(body: { reason?: string } = {}, opts: CallOptions = {}): Promise<ControlledSaga> {
    return this.client.cancel(this.sagaId, body, opts);
  }
}

async function readBody(res: Response): Promise<unknown> {
  const text = await res.text();
  if (!text) return undefined;
  const type = res.headers.get("Content-Type") ?? "";
  if (/json/i.test(type)) {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }
  return text;
}
