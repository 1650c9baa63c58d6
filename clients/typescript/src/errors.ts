// Typed errors of the idem client: one class per kind of answer an agent
// handles differently, built from the server's RFC 7807 / 9457 problem
// documents ({type, title, status, detail}, type "urn:idem:problem:<name>").

/** The problem document the server sent (RFC 7807 / 9457). */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail?: string;
  [extra: string]: unknown;
}

/**
 * What kind of failure this is, for a `switch`:
 * - `conflict`: 409 (intent key in use with other content, approval not
 *   pending, a commit refused while a call is unsettled, ...);
 * - `saga_not_open`: 409 `saga-not-open` (the open saga was committed,
 *   rolled back or cancelled);
 * - `call_id_reused`: 409 `call-id-reused` (an open-saga call's `call_id`
 *   was recorded for another tool or other arguments; nothing was called);
 * - `not_found`: 404; `unauthorized`: 401; `forbidden`: 403;
 * - `invalid`: 400, 413, 414, 415, 422, 431 (the request is wrong; the detail
 *   names the place);
 * - `unavailable`: 503 (overloaded, store unavailable, saga busy) or 429;
 *   retried by the client with backoff where that is safe;
 * - `server`: another 5xx; `network`: no HTTP answer at all (connection
 *   refused or reset, timeout): the outcome of a POST is then unknown;
 * - `other`: any other status.
 */
export type IdemErrorKind =
  | "conflict"
  | "saga_not_open"
  | "call_id_reused"
  | "not_found"
  | "unauthorized"
  | "forbidden"
  | "invalid"
  | "unavailable"
  | "server"
  | "network"
  | "other";

const PROBLEM_PREFIX = "urn:idem:problem:";

/**
 * An error answer of the idem API, or no answer. `type`, `status`, `title`
 * and `detail` are the problem document's (for a network error: type
 * "urn:idem:problem:network", status 0). `name` is the short problem name
 * (`intent-conflict`, `saga-not-open`, ...). `retryAfterSeconds` is the
 * server's Retry-After, when sent.
 */
export class IdemError extends Error {
  readonly kind: IdemErrorKind;
  readonly type: string;
  readonly status: number;
  readonly title: string;
  readonly detail: string;
  readonly problem: Problem | undefined;
  readonly method: string;
  readonly path: string;
  readonly retryAfterSeconds: number | undefined;

  constructor(init: {
    kind: IdemErrorKind;
    type: string;
    status: number;
    title: string;
    detail?: string;
    problem?: Problem;
    method: string;
    path: string;
    retryAfterSeconds?: number;
    cause?: unknown;
  }) {
    const where = `${init.method} ${init.path}`;
    const status = init.status ? `${init.status} ` : "";
    super(
      `${where}: ${status}${init.title}${init.detail ? `: ${init.detail}` : ""}`,
      init.cause === undefined ? undefined : { cause: init.cause },
    );
    this.name = new.target.name;
    this.kind = init.kind;
    this.type = init.type;
    this.status = init.status;
    this.title = init.title;
    this.detail = init.detail ?? "";
    this.problem = init.problem;
    this.method = init.method;
    this.path = init.path;
    this.retryAfterSeconds = init.retryAfterSeconds;
  }

  /** The problem's short name: "saga-not-open" for urn:idem:problem:saga-not-open. */
  get problemName(): string {
    return this.type.startsWith(PROBLEM_PREFIX) ? this.type.slice(PROBLEM_PREFIX.length) : this.type;
  }
}

export class IdemConflictError extends IdemError {}
/** 409 saga-not-open: the open saga no longer takes calls. */
export class IdemSagaNotOpenError extends IdemConflictError {}

function member(problem: Problem | undefined, name: string): string {
  const v = problem?.[name];
  return typeof v === "string" ? v : "";
}

/**
 * 409 call-id-reused: this `call_id` was recorded for another call (another
 * tool, or arguments with another fingerprint), and nothing was called. A
 * call id names one intent: a new call needs a new `call_id` (with
 * `repeat: true` to make the same call a second time on purpose). Resending
 * the first call's own arguments with the id answers it from the journal.
 */
export class IdemCallIdReusedError extends IdemConflictError {
  /** The reused call id. */
  get callId(): string {
    return member(this.problem, "call_id");
  }
  /** The tool the id was first given to. */
  get recordedTool(): string {
    return member(this.problem, "recorded_tool");
  }
  /** The fingerprint ("sha256:...") of the arguments the id was first given with. */
  get recordedArgsFingerprint(): string {
    return member(this.problem, "recorded_args_fingerprint");
  }
  /** The refused call's tool. */
  get tool(): string {
    return member(this.problem, "tool");
  }
  /** The fingerprint of the refused call's arguments. */
  get argsFingerprint(): string {
    return member(this.problem, "args_fingerprint");
  }
}
export class IdemNotFoundError extends IdemError {}
export class IdemUnauthorizedError extends IdemError {}
export class IdemForbiddenError extends IdemError {}
export class IdemValidationError extends IdemError {}
/** 503 (or 429): the server did not take the request now; try again later. */
export class IdemUnavailableError extends IdemError {}
export class IdemServerError extends IdemError {}
/**
 * No HTTP answer (refused, reset, timed out). For a POST the outcome is
 * unknown: retry with the same Idempotency-Key / call_id, never a new one.
 */
export class IdemNetworkError extends IdemError {}

/** The kind of an HTTP error answer. */
export function kindOf(status: number, type: string): IdemErrorKind {
  if (status === 409) {
    if (type === `${PROBLEM_PREFIX}saga-not-open`) return "saga_not_open";
    if (type === `${PROBLEM_PREFIX}call-id-reused`) return "call_id_reused";
    return "conflict";
  }
  if (status === 404) return "not_found";
  if (status === 401) return "unauthorized";
  if (status === 403) return "forbidden";
  if (status === 503 || status === 429) return "unavailable";
  if ([400, 413, 414, 415, 422, 431].includes(status)) return "invalid";
  if (status >= 500) return "server";
  return "other";
}

const CLASSES: Record<IdemErrorKind, typeof IdemError> = {
  conflict: IdemConflictError,
  saga_not_open: IdemSagaNotOpenError,
  call_id_reused: IdemCallIdReusedError,
  not_found: IdemNotFoundError,
  unauthorized: IdemUnauthorizedError,
  forbidden: IdemForbiddenError,
  invalid: IdemValidationError,
  unavailable: IdemUnavailableError,
  server: IdemServerError,
  network: IdemNetworkError,
  other: IdemError,
};

/** Seconds of a Retry-After header (delta-seconds or an HTTP date), if any. */
export function parseRetryAfter(value: string | null): number | undefined {
  if (!value) return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim());
  const at = Date.parse(value);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, (at - Date.now()) / 1000);
}

/** The typed error for an HTTP error answer: its problem document when it sent one. */
export function errorFromResponse(
  method: string,
  path: string,
  status: number,
  body: unknown,
  retryAfter: string | null,
): IdemError {
  const doc = body && typeof body === "object" ? (body as Record<string, unknown>) : undefined;
  const problem =
    doc && typeof doc.type === "string" && typeof doc.title === "string"
      ? ({ ...doc, status: typeof doc.status === "number" ? doc.status : status } as Problem)
      : undefined;
  const type = problem?.type ?? `${PROBLEM_PREFIX}http-${status}`;
  const kind = kindOf(status, type);
  const Cls = CLASSES[kind];
  return new Cls({
    kind,
    type,
    status,
    title: problem?.title ?? `HTTP ${status}`,
    detail:
      typeof problem?.detail === "string"
        ? problem.detail
        : typeof body === "string"
          ? body.slice(0, 500)
          : undefined,
    problem,
    method,
    path,
    retryAfterSeconds: parseRetryAfter(retryAfter),
  });
}

/** The typed error for a request that got no HTTP answer. */
export function networkError(method: string, path: string, cause: unknown): IdemNetworkError {
  const reason =
    cause instanceof Error ? (cause.cause instanceof Error ? `${cause.message}: ${cause.cause.message}` : cause.message) : String(cause);
  return new IdemNetworkError({
    kind: "network",
    type: `${PROBLEM_PREFIX}network`,
    status: 0,
    title: "no answer from the server",
    detail: reason,
    method,
    path,
    cause,
  });
}
