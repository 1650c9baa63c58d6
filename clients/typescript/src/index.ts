// @idem/client: the idem REST API for TypeScript and JavaScript (ESM, the
// platform's fetch, no runtime dependencies). The OpenAI Agents SDK adapter
// is the separate entry point "@idem/client/openai-agents".

export { IdemClient, OpenSagaSession } from "./client.js";
export type { IdemClientOptions, IdemRequest, IdemResponse, CallOptions, WaitOptions, Submitted } from "./client.js";
export {
  IdemError,
  IdemConflictError,
  IdemSagaNotOpenError,
  IdemCallIdReusedError,
  IdemNotFoundError,
  IdemUnauthorizedError,
  IdemForbiddenError,
  IdemValidationError,
  IdemUnavailableError,
  IdemServerError,
  IdemNetworkError,
} from "./errors.js";
export type { IdemErrorKind, Problem } from "./errors.js";
export type { RetryOptions, RetryEvent } from "./retry.js";
export * from "./types.js";
export * from "./vocabulary.js";
