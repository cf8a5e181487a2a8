// Errors: every failed call becomes a CtxdError carrying the gRPC status code and the server's
// message, in a subclass per code a caller acts on differently.
import { Metadata, status, type ServiceError } from "@grpc/grpc-js";

import type { Appended } from "./types";

/** A ctxd call failed. `code` is the gRPC status, `details` the server's own words. */
export class CtxdError extends Error {
  /** The gRPC status code (`status.NOT_FOUND`, ...; import `status` from "@grpc/grpc-js"). */
  readonly code: status;
  /** The status's name, e.g. `"NOT_FOUND"`. */
  readonly codeName: string;
  /** The server's message, verbatim (it names the field or node at fault). */
  readonly details: string;
  /** Trailing metadata of the failed call, when there was a call. */
  readonly metadata: Metadata;
  /** Set by `appendMany` only: the requests its stream wrote before it failed, one `Appended`
   * each, in order, since a bulk write that fails part-way has still stored those. On a refusal
   * the refused request is number `acknowledged.length` (the message starts `requests[N]`) and
   * nothing after it was written. */
  acknowledged?: Appended[];

  constructor(code: status, details: string, metadata: Metadata = new Metadata(), options?: ErrorOptions) {
    super(`${status[code] ?? code}: ${details}`, options);
    this.name = new.target.name;
    this.code = code;
    this.codeName = status[code] ?? String(code);
    this.details = details;
    this.metadata = metadata;
  }
}

/** Malformed input; the message names the field (or the node). */
export class InvalidArgumentError extends CtxdError {}
/** An unknown session, branch, node, function or compaction (or another tenant's). */
export class NotFoundError extends CtxdError {}
/** A branch with that name exists already. */
export class AlreadyExistsError extends CtxdError {}
/** Well-formed but not allowed now: calls still pending, a closed function, an idempotency key
 * reused with other content. */
export class FailedPreconditionError extends CtxdError {}
/** A compare-and-swap lost (ABORTED): the head moved. Re-read it and retry. */
export class AbortedError extends CtxdError {}
/** No API key, a malformed one, or one the server does not know (`new Client(addr, { apiKey })`). */
export class UnauthenticatedError extends CtxdError {}
/** The key is valid but may not do this. */
export class PermissionDeniedError extends CtxdError {}
/** Too large, or too many calls at once. */
export class ResourceExhaustedError extends CtxdError {}
/** The server cannot be reached (wrong address, TLS handshake refused) or is busy: retrying may
 * help. */
export class UnavailableError extends CtxdError {}
/** The call's deadline (`timeoutMs`) passed. */
export class DeadlineExceededError extends CtxdError {}
/** The server does not implement the call (an older server). */
export class UnimplementedError extends CtxdError {}

const BY_CODE: Partial<Record<status, new (code: status, details: string, metadata?: Metadata, options?: ErrorOptions) => CtxdError>> = {
  [status.INVALID_ARGUMENT]: InvalidArgumentError,
  [status.NOT_FOUND]: NotFoundError,
  [status.ALREADY_EXISTS]: AlreadyExistsError,
  [status.FAILED_PRECONDITION]: FailedPreconditionError,
  [status.ABORTED]: AbortedError,
  [status.UNAUTHENTICATED]: UnauthenticatedError,
  [status.PERMISSION_DENIED]: PermissionDeniedError,
  [status.RESOURCE_EXHAUSTED]: ResourceExhaustedError,
  [status.UNAVAILABLE]: UnavailableError,
  [status.DEADLINE_EXCEEDED]: DeadlineExceededError,
  [status.UNIMPLEMENTED]: UnimplementedError,
};

/** The CtxdError subclass for `code`. */
export function ctxdError(code: status, details: string, metadata?: Metadata, cause?: unknown): CtxdError {
  const Class = BY_CODE[code] ?? CtxdError;
  return new Class(code, details, metadata, cause === undefined ? undefined : { cause });
}

/** The CtxdError for a failed grpc-js call (the original error is kept as `cause`). */
export function fromServiceError(error: ServiceError, context?: string): CtxdError {
  const details = error.details || error.message;
  return ctxdError(error.code, context ? `${context}: ${details}` : details, error.metadata, error);
}
