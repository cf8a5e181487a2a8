// The Client: one grpc-js channel to a ctxd server, an async method per RPC taking plain values,
// the API key on every call, TLS, a connect deadline, and errors as CtxdError subclasses.
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import { createReadStream, createWriteStream, readFileSync } from "node:fs";
import { rename, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { pipeline } from "node:stream/promises";
import * as grpc from "@grpc/grpc-js";

import { CtxdError, ctxdError, fromServiceError, UnavailableError } from "./errors";
import * as pb from "./gen/ctxd/v1/ctxd";
import { assistantMessage, type Content, type NodeOptions, toolResult, userMessage } from "./nodes";
import {
  type Appended,
  appendedFromPb,
  type Backup,
  type Branch,
  branchFromPb,
  type BudgetLike,
  budgetToPb,
  CALLERS,
  type Callers,
  choice,
  type Compaction,
  type ContextReport,
  type Deleted,
  type ExportChunk,
  type Exported,
  EXPORT_FORMATS,
  type ExportFormat,
  type Expose,
  type Format,
  type FormatDocuments,
  FORMATS,
  type GarbageCollected,
  type Imported,
  importedFromPb,
  IMPORT_FORMATS,
  type GatewayCall,
  gatewayCallFromPb,
  type ImportFormat,
  type Node,
  nodeFromPb,
  type NodeInput,
  nodeInputToPb,
  type Outcome,
  outcomeFromPb,
  type Recalled,
  recalledFromPb,
  type RecallToolDefinitions,
  type RenderedMessage,
  renderedFromPb,
  type RenderPolicy,
  policyToPb,
  type RenderResult,
  type Session,
  sessionFromPb,
  sessionId,
  type SessionRef,
  type Summaries,
  summariesFromPb,
  summaryKind,
  SUMMARY_REQUEST_FORMS,
  type SummaryRequestForm,
  tombstoneFromPb,
  type ToolCallInput,
  type WatchEvent,
  watchEventFromPb,
} from "./types";

/** PEM bytes or text given inline, or read from a file by the constructor. */
export interface TlsOptions {
  /** The CA to trust (PEM); the system's roots without it. */
  ca?: string | Uint8Array;
  caFile?: string;
  /** A client certificate chain and its key (PEM), for a server that requires mutual TLS. */
  cert?: string | Uint8Array;
  certFile?: string;
  key?: string | Uint8Array;
  keyFile?: string;
}

export interface ClientOptions {
  /** Sent as `authorization: Bearer <key>` with every call (the `raw` stub's too). */
  apiKey?: string;
  /** TLS: `true` trusts the system's roots; an object names a CA and a client certificate. An
   * `https://` address turns it on too. */
  tls?: boolean | TlsOptions;
  /** Deadline of each call, in milliseconds (of a whole stream for `appendMany` and
   * `exportSession`; a watch has none). Default: none. */
  timeoutMs?: number;
  /** How long the first call waits for a connection before failing with UnavailableError.
   * Default 10000. A refused connection fails at once. */
  connectTimeoutMs?: number;
  /** Extra grpc-js channel options (message size limits, keepalive, ...). */
  channelOptions?: grpc.ChannelOptions;
}

/** Where to append, and how. */
export interface AppendOptions {
  /** Default `main`; ignored when `functionId` is set. */
  branch?: string;
  /** Append to the internal chain of this running function instead. */
  functionId?: string;
  /** Compare-and-swap: append only if the target's head is this node (`""`: no head yet). A lost
   * race throws AbortedError. */
  expectedHeadId?: string;
  /** A retry with the same key returns the first answer and writes nothing. */
  idempotencyKey?: string;
  /** Pin every node of the batch. */
  pinned?: boolean;
}

/** One append of `appendMany`: its nodes, and the options a unary append takes, for this request
 * alone. A request that names a target (`branch` or `functionId`) writes there; one that names
 * none writes to the target of the call's `AppendManyOptions`. */
export interface AppendManyRequest extends AppendOptions {
  nodes: NodeInput[];
}

/** Defaults for every request of `appendMany`. Compare-and-swap and idempotency keys are per
 * request (`AppendManyRequest`): one head or one key for the whole stream would refuse the
 * second request or answer it with the first's result. */
export type AppendManyOptions = Pick<AppendOptions, "branch" | "functionId" | "pinned">;

/** What to render: a branch's head (default `main`), the path ending at a node, or a function's
 * chain. */
export interface Target {
  branch?: string;
  nodeId?: string;
  functionId?: string;
}

export interface StatsOptions extends Target {
  /** Absent: everything, untouched. */
  budget?: BudgetLike;
  /** `heuristic` (the default), `o200k_base`, `cl100k_base`. */
  tokenizer?: string;
  policy?: RenderPolicy;
  /** The provider just refused the request as too long. */
  reactive?: boolean;
  callers?: Callers;
  /** The engine never reads the clock; 0 means the server's now. */
  nowUnixMs?: number;
  /** When the host last sent this context to the model: a render more than the cache's lifetime
   * (5 minutes) after it takes a step, which is free then. 0: the newest assistant message's call. */
  lastCallUnixMs?: number;
  /** The model the context is for (`claude-opus-5-5`, `gpt-5`, …): its cache prices and lifetime
   * weigh every step (unless `policy` sets the prices), and the report's `pricedBy` names the
   * model table's entry. For a model that binds its thinking to its prefix (Anthropic's current
   * models) an Anthropic document never holds a thinking block after content the render
   * changed: with `policy.reasoning` `"keep"` (the default) a step is the provider's own edit,
   * in the document's `context_management` (send it with `betas`), with `"drop"` the
   * invalidated thinking is left out. Absent: no model. */
  model?: string;
}

export interface RenderOptions<F extends Format> extends StatsOptions {
  /** Default `openai`. */
  format?: F;
  /** Refuse (InvalidArgumentError naming the node) a render whose document cannot carry a media
   * part where it stands, instead of sending it as `[<mime> attachment]` text. */
  strictFormat?: boolean;
}

export interface CompactionOptions {
  branch?: string;
  tokenizer?: string;
  retainTurns?: number;
  /** For the summarizer; stored with the plan. */
  instructions?: string;
  maxToolResultChars?: number;
  /** A segment summary: exactly these nodes, inclusive. Both or neither. */
  fromNodeId?: string;
  toNodeId?: string;
  /** The render policy of the host's renders: what `cacheSharingRequest` (prepare) and the
   * cache-sharing request form (compact) render the context with. */
  policy?: RenderPolicy;
}

export interface ImportOptions {
  /** Absent: detected from the first line. */
  format?: ImportFormat;
  metadata?: Record<string, string>;
  /** A retry with the same key returns the session the first import created. */
  idempotencyKey?: string;
  /** Bytes per streamed chunk. Default 1 MiB (the server takes up to 16 MiB a chunk). */
  chunkBytes?: number;
}

/** Which sessions `listSessions` and `sessions` answer: those matching every filter given. */
export interface SessionFilter {
  /** Only sessions whose id starts with this, e.g. `0193f2a1-7` (upper-case hex is accepted); a
   * prefix no UUID can start with rejects with InvalidArgumentError. */
  idPrefix?: string;
  /** Only sessions whose metadata holds every one of these pairs exactly (at most 16). */
  metadata?: Record<string, string>;
}

export interface ListSessionsOptions extends SessionFilter {
  /** Sessions per page: 0 (the default) is the server's, 50; at most 1000. */
  pageSize?: number;
  /** `nextPageToken` of the previous page, asked with the same filter; empty for the first. */
  pageToken?: string;
}

export interface ListGatewayCallsOptions {
  /** Calls per page: 0 (the default) is the server's, 100; at most 1000. */
  pageSize?: number;
  /** `nextPageToken` of the previous page; empty for the first (the oldest calls). */
  pageToken?: string;
}

export interface ExportOptions {
  /** `ctxd` (the default): the whole session, every branch, function chain, summary and pin, as
   * `importSession` reads back; `openai` or `claude-code`: one branch. */
  format?: ExportFormat;
  /** The branch the one-branch formats export; default `main`. Ignored by `ctxd`. */
  branch?: string;
}

export interface WatchOptions {
  /** Follow this branch only; absent: every branch. */
  branch?: string;
  /** Start right after the event whose `cursor` this is (a cursor of a watch of the same session
   * and branch), e.g. one saved before the process restarted. */
  afterCursor?: string;
  /** With `branch`, instead of `afterCursor`: start right after this node of the branch (the last
   * one you have). */
  afterNodeId?: string;
  /** Ends the watch: the iterator returns, without an error. */
  signal?: AbortSignal;
  /** How many attempts in a row may fail to resume a dropped watch before its error is thrown.
   * Default 10 (about 20 s of backoff). */
  maxReconnects?: number;
  /** Called before each attempt to resume, with the failure that ended the stream and the
   * attempt's number in the current run of failures (from 1). */
  onReconnect?: (error: CtxdError, attempt: number) => void;
}

const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
const DEFAULT_MAX_RECONNECTS = 10;

function pem(inline: string | Uint8Array | undefined, file: string | undefined, what: string): Buffer | null {
  if (inline !== undefined && file !== undefined) throw new TypeError(`give ${what} or ${what}File, not both`);
  if (file !== undefined) return readFileSync(file);
  if (inline === undefined) return null;
  return typeof inline === "string" ? Buffer.from(inline) : Buffer.from(inline);
}

/** Adds `authorization: Bearer <key>` to every call, whatever its kind. */
function bearer(apiKey: string): grpc.Interceptor {
  // A key travels in an HTTP header: visible ASCII, no spaces.
  if (!/^[\x21-\x7e]+$/.test(apiKey)) throw new TypeError("apiKey must be non-empty visible ASCII");
  const value = `Bearer ${apiKey}`;
  return (options, nextCall) =>
    new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set("authorization", value);
        next(metadata, listener);
      },
    });
}

type Callback<T> = (error: grpc.ServiceError | null, response: T) => void;

/**
 * A connection to a ctxd server. Close it with `close()`, or let `await using` do it:
 *
 *     await using ctxd = new Client("127.0.0.1:50051");
 */
export class Client implements AsyncDisposable {
  /** The generated grpc-js stub on the same channel (API key included), for anything the
   * methods here do not cover. */
  readonly raw: pb.ContextStoreClient;
  readonly address: string;
  readonly timeoutMs: number | undefined;
  readonly connectTimeoutMs: number;
  #connected = false;
  #hasKey: boolean;

  constructor(address = "127.0.0.1:50051", options: ClientOptions = {}) {
    let target = address;
    let tls = options.tls ?? false;
    const scheme = /^(https?):\/\//.exec(address);
    if (scheme) {
      target = address.slice(scheme[0].length).replace(/\/+$/, "");
      if (scheme[1] === "https" && tls === false) tls = true;
      if (scheme[1] === "http" && tls !== false) throw new TypeError("an http:// address with TLS options: use https://");
    }
    this.address = target;
    this.timeoutMs = options.timeoutMs;
    this.connectTimeoutMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    this.#hasKey = options.apiKey !== undefined;

    let credentials: grpc.ChannelCredentials;
    if (tls === false) {
      credentials = grpc.credentials.createInsecure();
    } else {
      const t = tls === true ? {} : tls;
      const cert = pem(t.cert, t.certFile, "cert");
      const key = pem(t.key, t.keyFile, "key");
      if ((cert === null) !== (key === null)) throw new TypeError("a client cert and its key go together");
      credentials = grpc.credentials.createSsl(pem(t.ca, t.caFile, "ca"), key, cert);
    }
    const interceptors = options.apiKey !== undefined ? [bearer(options.apiKey)] : [];
    this.raw = new pb.ContextStoreClient(target, credentials, { ...options.channelOptions, interceptors });
  }

  /** Closes the channel; calls in flight fail. */
  close(): void {
    this.raw.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }

  // ------------------------------------------------------------ plumbing

  /** Until the channel has once been ready: wait for it, at most `connectTimeoutMs`. A failed
   * attempt returns at once, so the call itself fails with grpc-js's reason (connection refused,
   * a TLS handshake the server refused) rather than after the whole timeout. */
  async #connect(): Promise<void> {
    if (this.#connected) return;
    const channel = this.raw.getChannel();
    const deadline = Date.now() + this.connectTimeoutMs;
    await new Promise<void>((resolve, reject) => {
      const step = (): void => {
        const state = channel.getConnectivityState(true);
        if (state === grpc.connectivityState.READY) {
          this.#connected = true;
          return resolve();
        }
        if (state === grpc.connectivityState.TRANSIENT_FAILURE) return resolve();
        if (state === grpc.connectivityState.SHUTDOWN) {
          return reject(ctxdError(grpc.status.UNAVAILABLE, `the client of ${this.address} is closed`));
        }
        channel.watchConnectivityState(state, deadline, (error) => {
          if (!error) return step();
          reject(
            new UnavailableError(
              grpc.status.UNAVAILABLE,
              `cannot reach ctxd at ${this.address}: no connection within ${this.connectTimeoutMs} ms`,
            ),
          );
        });
      };
      step();
    });
  }

  #callOptions(): Partial<grpc.CallOptions> {
    return this.timeoutMs === undefined ? {} : { deadline: Date.now() + this.timeoutMs };
  }

  #error(error: grpc.ServiceError): CtxdError {
    // Say which server could not be reached: grpc-js's message names only the socket error.
    if (error.code === grpc.status.UNAVAILABLE && !this.#connected) {
      // grpc-js ends its message with an empty "Resolution note: " when there is none.
      error.details = (error.details || error.message).replace(/\.? Resolution note: $/, "");
      return fromServiceError(error, `cannot reach ctxd at ${this.address}`);
    }
    if (error.code === grpc.status.UNAUTHENTICATED && !this.#hasKey) {
      return fromServiceError(error, "the server wants an API key (new Client(address, { apiKey }))");
    }
    return fromServiceError(error);
  }

  async #call<T>(invoke: (metadata: grpc.Metadata, options: Partial<grpc.CallOptions>, callback: Callback<T>) => unknown): Promise<T> {
    await this.#connect();
    return new Promise<T>((resolve, reject) => {
      invoke(new grpc.Metadata(), this.#callOptions(), (error, response) => {
        if (error) return reject(this.#error(error));
        this.#connected = true;
        resolve(response);
      });
    });
  }

  /** The messages of a server stream as they are read (with backpressure: grpc-js reads on only
   * as they are taken), failures as CtxdError. Leaving early (a `break`, `signal`) cancels the
   * call, so the server stops producing. */
  async *#stream<T>(open: () => grpc.ClientReadableStream<T>, signal?: AbortSignal): AsyncGenerator<T> {
    await this.#connect();
    const call = open();
    // grpc-js emits a failed status (our own cancel's included) as `error`, also after the loop
    // below has left; only Node's iterator keeping its listener would stop that being uncaught.
    call.on("error", () => undefined);
    const cancel = (): void => call.cancel();
    signal?.addEventListener("abort", cancel, { once: true });
    try {
      for await (const message of call as AsyncIterable<T>) {
        this.#connected = true;
        yield message;
      }
    } catch (error) {
      throw isServiceError(error) ? this.#error(error) : error;
    } finally {
      signal?.removeEventListener("abort", cancel);
      call.cancel(); // a no-op once the status has arrived
    }
  }

  // ------------------------------------------------------------ sessions

  /** A new session with an empty `main` branch. With `idempotencyKey`, a retry returns the
   * session the first call created instead of a second one. */
  async createSession(options: { metadata?: Record<string, string>; idempotencyKey?: string } = {}): Promise<Session> {
    const request = pb.CreateSessionRequest.fromPartial({ metadata: options.metadata ?? {}, idempotencyKey: options.idempotencyKey ?? "" });
    return sessionFromPb(await this.#call<pb.Session>((m, o, cb) => this.raw.createSession(request, m, o, cb)));
  }

  async getSession(session: SessionRef): Promise<Session> {
    const request = { sessionId: sessionId(session) };
    return sessionFromPb(await this.#call<pb.Session>((m, o, cb) => this.raw.getSession(request, m, o, cb)));
  }

  /** Deletes a session for good, in one transaction: its nodes, branches, summaries, pins and
   * events, and every content blob no other session refers to. The tombstone (who, when, how
   * many nodes) stays for the audit: deleting again answers the same one with
   * `alreadyDeleted`. A session never seen, or another tenant's, rejects with NotFoundError. */
  async deleteSession(session: SessionRef): Promise<Deleted> {
    const request = { sessionId: sessionId(session) };
    const r = await this.#call<pb.DeleteSessionResponse>((m, o, cb) => this.raw.deleteSession(request, m, o, cb));
    return { tombstone: tombstoneFromPb(r.tombstone), alreadyDeleted: r.alreadyDeleted };
  }

  /** One page of sessions, newest first, those matching the filter only; `nextPageToken` is
   * empty on the last page. */
  async listSessions(options: ListSessionsOptions = {}): Promise<{ sessions: Session[]; nextPageToken: string }> {
    const request = pb.ListSessionsRequest.fromPartial({
      pageSize: options.pageSize ?? 0,
      pageToken: options.pageToken ?? "",
      idPrefix: options.idPrefix ?? "",
      metadata: options.metadata ?? {},
    });
    const r = await this.#call<pb.ListSessionsResponse>((m, o, cb) => this.raw.listSessions(request, m, o, cb));
    return { sessions: r.sessions.map(sessionFromPb), nextPageToken: r.nextPageToken };
  }

  /** One page of the model gateway's calls of a session, in the order they were made (newest
   * last), with `nextPageToken` (empty on the last page): what the client sent and what was
   * forwarded, what the provider's cache read and wrote, what was kept of the previous request
   * and why it changed, and whether the cache missed with nothing to explain it. A session the
   * gateway never served has none; an unknown one rejects with NotFoundError. */
  async listGatewayCalls(session: SessionRef, options: ListGatewayCallsOptions = {}): Promise<{ calls: GatewayCall[]; nextPageToken: string }> {
    const request = pb.ListGatewayCallsRequest.fromPartial({
      sessionId: sessionId(session),
      pageSize: options.pageSize ?? 0,
      pageToken: options.pageToken ?? "",
    });
    const r = await this.#call<pb.ListGatewayCallsResponse>((m, o, cb) => this.raw.listGatewayCalls(request, m, o, cb));
    return { calls: r.calls.map(gatewayCallFromPb), nextPageToken: r.nextPageToken };
  }

  /** Every session matching `filter`, newest first, following the pages. */
  async *sessions(pageSize = 0, filter: SessionFilter = {}): AsyncGenerator<Session> {
    let pageToken = "";
    do {
      const page = await this.listSessions({ ...filter, pageSize, pageToken });
      yield* page.sessions;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  // ------------------------------------------------------------ appends and reads

  /** Appends nodes atomically and in order (see AppendOptions for CAS and idempotency). */
  async append(session: SessionRef, nodes: NodeInput[], options: AppendOptions = {}): Promise<Appended> {
    const request = appendRequest(sessionId(session), nodes, options);
    return appendedFromPb(await this.#call<pb.AppendResponse>((m, o, cb) => this.raw.append(request, m, o, cb)));
  }

  /**
   * Many appends over one AppendStream, for imports and bulk writes: one round trip per run of
   * requests the server reads together (one transaction each) instead of one per append. Each
   * request (a `NodeInput[]`, or an `AppendManyRequest` with its own target, compare-and-swap or
   * idempotency key) is checked exactly as `append` checks it, in order; the answer is one
   * `Appended` per request, in order.
   *
   * The first refused request rejects with the CtxdError of its status (the message starts
   * `requests[N]`, N counted from 0) whose `acknowledged` holds what was written before it;
   * nothing after it is written. Any other failure (UNAVAILABLE when the server shuts down, the
   * deadline) carries `acknowledged` too: those are stored, and a request after them may be as
   * well, so retry with idempotency keys.
   *
   * Requests are sent as `batches` yields them, waiting while grpc-js's send buffer is full, and
   * answers are read as they come, so an async iterable of any length streams in bounded memory.
   * An array is converted before anything is sent (a malformed node throws TypeError, writing
   * nothing, as `append` does); an iterable as it is read, and if it throws, the requests sent
   * before are still written and acknowledged (the stream is ended, not cancelled) before its
   * error is rethrown. `timeoutMs` bounds the whole stream.
   */
  async appendMany(
    session: SessionRef,
    batches: Iterable<NodeInput[] | AppendManyRequest> | AsyncIterable<NodeInput[] | AppendManyRequest>,
    options: AppendManyOptions = {},
  ): Promise<Appended[]> {
    const id = sessionId(session);
    const convert = (batch: NodeInput[] | AppendManyRequest, index: number): pb.AppendRequest => {
      if (Array.isArray(batch)) return appendRequest(id, batch, options);
      if (typeof batch !== "object" || batch === null || !Array.isArray(batch.nodes)) {
        throw new TypeError(`batches[${index}] must be NodeInput[] or { nodes: NodeInput[], ... }`);
      }
      const target = batch.branch !== undefined || batch.functionId !== undefined ? batch : options;
      return appendRequest(id, batch.nodes, {
        branch: target.branch,
        functionId: target.functionId,
        expectedHeadId: batch.expectedHeadId,
        idempotencyKey: batch.idempotencyKey,
        pinned: batch.pinned ?? options.pinned,
      });
    };
    const requests = Array.isArray(batches) ? converted(batches.map(convert), (r) => r) : converted(batches, convert);

    await this.#connect();
    const call = this.raw.appendStream(new grpc.Metadata(), this.#callOptions());
    const appended: Appended[] = [];
    let mismatch: CtxdError | undefined;
    // Settles once the server has ended the stream and every response before its status has
    // been read: grpc-js emits `error` at once, `end` after the responses it still buffers.
    let over = false;
    const ended = new Promise<grpc.ServiceError | undefined>((resolve) => {
      let failure: grpc.ServiceError | undefined;
      call.on("data", (r: pb.AppendStreamResponse) => {
        this.#connected = true;
        if (r.first !== appended.length && mismatch === undefined) {
          mismatch = ctxdError(grpc.status.INTERNAL, `AppendStream acknowledged requests from ${r.first}, expected ${appended.length}`);
          call.cancel();
        }
        if (mismatch === undefined) for (const a of r.appends) appended.push(appendedFromPb(a));
      });
      call.on("error", (error: grpc.ServiceError) => {
        failure ??= error;
      });
      const finish = (): void => {
        over = true;
        resolve(failure);
      };
      call.on("end", finish);
      call.on("close", finish);
    });

    // A stream the server ended (a refusal, a shutdown) stops the loop even while `batches` is
    // idle: nothing sent after it would be written.
    const stopped = ended.then((): typeof STOPPED => STOPPED);
    let sent = 0;
    let sourceFailed = false;
    let sourceError: unknown;
    try {
      let busy = false;
      let done = false;
      while (!over) {
        const next = await Promise.race([requests.next(), stopped]);
        if (next === STOPPED) {
          busy = true;
          break;
        }
        if (next.done) {
          done = true;
          break;
        }
        sent++;
        if (!call.write(next.value)) await drained(call, ended);
      }
      // Close the source as `break` in a for-await would, but without waiting for one still busy
      // producing its next request (it finishes that first): an idle source may never.
      if (busy) requests.return(undefined).catch(() => undefined);
      else if (!done) await requests.return(undefined);
    } catch (error) {
      sourceFailed = true;
      sourceError = error;
    }
    call.end();
    const failure = await ended;
    if (sourceFailed) throw sourceError;
    let error = mismatch ?? (failure === undefined ? undefined : this.#error(failure));
    if (error === undefined && appended.length !== sent) {
      error = ctxdError(grpc.status.INTERNAL, `AppendStream ended after acknowledging ${appended.length} of ${sent} requests`);
    }
    if (error !== undefined) {
      error.acknowledged = appended;
      throw error;
    }
    this.#connected = true;
    return appended;
  }

  /** Appends to write together: one unary Append when there is one, else one AppendStream (one
   * round trip, and the first refused leaves everything after it unwritten, as awaiting each
   * append in turn would). */
  async #appendAll(session: SessionRef, requests: AppendManyRequest[]): Promise<Appended[]> {
    if (requests.length === 1) {
      const { nodes, ...options } = requests[0];
      return [await this.append(session, nodes, options)];
    }
    return this.appendMany(session, requests);
  }

  async appendUser(session: SessionRef, content: Content, options: AppendOptions = {}): Promise<Appended> {
    return this.append(session, [userMessage(content)], options);
  }

  /** An assistant message; until each tool call is answered, nothing else may be appended. */
  async appendAssistant(session: SessionRef, content: Content, toolCalls: ToolCallInput[] = [], options: AppendOptions = {}): Promise<Appended> {
    return this.append(session, [assistantMessage(content, toolCalls)], options);
  }

  /** Answers one pending tool call of the latest assistant message. */
  async appendToolResult(
    session: SessionRef,
    callId: string,
    content: Content,
    options: AppendOptions & { isError?: boolean } = {},
  ): Promise<Appended> {
    return this.append(session, [toolResult(callId, content, { isError: options.isError })], options);
  }

  /** The nodes, in the order asked. */
  async getNodes(session: SessionRef, nodeIds: string[]): Promise<Node[]> {
    const request = { sessionId: sessionId(session), nodeIds };
    const r = await this.#call<pb.GetNodesResponse>((m, o, cb) => this.raw.getNodes(request, m, o, cb));
    return r.nodes.map(nodeFromPb);
  }

  /** One page of nodes walking parent links from a branch head (default `main`) or `nodeId`,
   * newest first, like `git log`. */
  async log(
    session: SessionRef,
    options: { branch?: string; nodeId?: string; limit?: number; pageToken?: string } = {},
  ): Promise<{ nodes: Node[]; nextPageToken: string }> {
    const request = {
      sessionId: sessionId(session),
      branch: options.nodeId ? "" : (options.branch ?? "main"),
      nodeId: options.nodeId ?? "",
      limit: options.limit ?? 0,
      pageToken: options.pageToken ?? "",
    };
    const r = await this.#call<pb.LogResponse>((m, o, cb) => this.raw.log(request, m, o, cb));
    return { nodes: r.nodes.map(nodeFromPb), nextPageToken: r.nextPageToken };
  }

  // ------------------------------------------------------------ branches

  /** A new branch at `fromNodeId` (absent: a branch with no head). Forking copies nothing. */
  async createBranch(session: SessionRef, name: string, fromNodeId = ""): Promise<Branch> {
    const request = { sessionId: sessionId(session), name, fromNodeId };
    return branchFromPb(await this.#call<pb.Branch>((m, o, cb) => this.raw.createBranch(request, m, o, cb)));
  }

  async listBranches(session: SessionRef): Promise<Branch[]> {
    const request = { sessionId: sessionId(session) };
    const r = await this.#call<pb.ListBranchesResponse>((m, o, cb) => this.raw.listBranches(request, m, o, cb));
    return r.branches.map(branchFromPb);
  }

  /** Moves branch `name` to `toNodeId` (a top-level node; `""`: no head), like `git reset`: no node
   * changes. With `expectedHeadId` (`""`: none), only if the head is still that one, else
   * AbortedError. */
  async resetBranch(session: SessionRef, name: string, toNodeId: string, options: { expectedHeadId?: string } = {}): Promise<Branch> {
    const request = { sessionId: sessionId(session), name, toNodeId, expectedHeadId: options.expectedHeadId };
    return branchFromPb(await this.#call<pb.Branch>((m, o, cb) => this.raw.resetBranch(request, m, o, cb)));
  }

  /** Removes the ref, never nodes. */
  async deleteBranch(session: SessionRef, name: string): Promise<void> {
    const request = { sessionId: sessionId(session), name };
    await this.#call<pb.DeleteBranchResponse>((m, o, cb) => this.raw.deleteBranch(request, m, o, cb));
  }

  // ------------------------------------------------------------ render

  #statsRequest(session: SessionRef, options: StatsOptions): pb.ContextStatsRequest {
    let target: pb.ContextStatsRequest["target"];
    if (options.functionId) target = { $case: "functionId", value: options.functionId };
    else if (options.nodeId) target = { $case: "nodeId", value: options.nodeId };
    else target = { $case: "branch", value: options.branch ?? "main" };
    return {
      sessionId: sessionId(session),
      target,
      tokenizer: options.tokenizer ?? "",
      callers: choice(CALLERS, options.callers ?? "all", "callers"),
      budget: options.budget === undefined ? undefined : budgetToPb(options.budget),
      policy: policyToPb(options.policy, options.reactive),
      nowUnixMs: options.nowUnixMs ?? 0,
      lastCallUnixMs: options.lastCallUnixMs ?? 0,
      model: options.model ?? "",
    };
  }

  /** The context of the next model request, fitted to `budget`, in `format` (OpenAI by default),
   * with a report of what every step did. */
  async render<F extends Format = "openai">(session: SessionRef, options: RenderOptions<F> = {}): Promise<RenderResult<F>> {
    const format = (options.format ?? "openai") as F;
    const request: pb.RenderRequest = {
      ...this.#statsRequest(session, options),
      format: choice(FORMATS, format, "format"),
      strictFormat: options.strictFormat ?? false,
    };
    const r = await this.#call<pb.RenderResponse>((m, o, cb) => this.raw.render(request, m, o, cb));
    const rendered = r.messages.map(renderedFromPb);
    const messages = (format === "neutral" ? rendered : document(r.messagesJson, "Render", "messagesJson")) as FormatDocuments[F];
    return {
      format,
      messages,
      rendered,
      report: r.report ?? pb.ContextReport.fromPartial({}),
      headId: r.headId,
      headHash: r.headHash,
      totalTokens: r.totalTokens,
      tokenizer: r.tokenizer,
      uncarried: r.uncarried.map((u) => ({ nodeId: u.nodeId, partIndex: u.partIndex, mimeType: u.mimeType })),
      betas: r.betas,
    };
  }

  /** The report `render` would give, without the messages: for a context panel. */
  async contextStats(session: SessionRef, options: StatsOptions = {}): Promise<ContextReport> {
    const request = this.#statsRequest(session, options);
    return this.#call<pb.ContextReport>((m, o, cb) => this.raw.contextStats(request, m, o, cb));
  }

  // ------------------------------------------------------------ recall

  /** The original content of what a render cleared, cut or stubbed, by the reference its
   * placeholder names (the 12 hexadecimal characters after `recall`, as in
   * `[cleared to save context: recall 3f9a2c1b7d04]`). A tool result's text comes back exactly;
   * content longer than `maxChars` (server default 20000, at most 200000) as its head, with
   * `truncated`. A reference no node of this session has (another session's included) rejects
   * with NotFoundError; a malformed one with InvalidArgumentError naming `reference`. To answer a
   * model's call of the recall tool, see `handleRecall`. */
  async recall(session: SessionRef, reference: string, options: { maxChars?: number } = {}): Promise<Recalled> {
    const request: pb.RecallRequest = { sessionId: sessionId(session), reference, maxChars: options.maxChars ?? 0 };
    return recalledFromPb(await this.#call<pb.RecallResponse>((m, o, cb) => this.raw.recall(request, m, o, cb)));
  }

  /** The recall tool's definition in the three API shapes, as the server gives it. The same
   * definition ships as constants (`recallToolDefinition`), so registering needs no call. */
  async recallTool(): Promise<RecallToolDefinitions> {
    const r = await this.#call<pb.RecallToolResponse>((m, o, cb) => this.raw.recallTool({}, m, o, cb));
    return {
      name: r.name,
      anthropic: JSON.parse(r.anthropicJson),
      openai: JSON.parse(r.openaiJson),
      responses: JSON.parse(r.responsesJson),
    };
  }

  // ------------------------------------------------------------ summaries

  /** Plans a summary that would make the branch fit `budget` and returns what a summarizer should
   * read, in `format` (OpenAI by default). `needed: false` when the history fits. With
   * `cacheSharingRequest` (rolling summaries) the plan also carries `summaryRequest`: the context
   * exactly as `render` gives it with `policy`, then one user message asking for the summary, so
   * the summarizing call reads the host's cached prefix. */
  async prepareCompaction<F extends Format = "openai">(
    session: SessionRef,
    budget: BudgetLike,
    options: CompactionOptions & { format?: F; cacheSharingRequest?: boolean } = {},
  ): Promise<Compaction<F>> {
    const format = (options.format ?? "openai") as F;
    const request: pb.PrepareCompactionRequest = {
      sessionId: sessionId(session),
      branch: options.branch ?? "main",
      budget: budgetToPb(budget),
      tokenizer: options.tokenizer ?? "",
      retainTurns: options.retainTurns ?? 0,
      instructions: options.instructions ?? "",
      maxToolResultChars: options.maxToolResultChars ?? 0,
      format: choice(FORMATS, format, "format"),
      fromNodeId: options.fromNodeId ?? "",
      toNodeId: options.toNodeId ?? "",
      cacheSharingRequest: options.cacheSharingRequest ?? false,
      policy: options.policy === undefined ? undefined : policyToPb(options.policy),
    };
    const r = await this.#call<pb.PrepareCompactionResponse>((m, o, cb) => this.raw.prepareCompaction(request, m, o, cb));
    const rendered = r.summaryInput.map(renderedFromPb);
    let summaryInput: FormatDocuments[F] | [];
    if (format === "neutral") summaryInput = rendered as FormatDocuments[F];
    else if (r.needed || r.summaryInputJson) summaryInput = document(r.summaryInputJson, "PrepareCompaction", "summaryInputJson") as FormatDocuments[F];
    else summaryInput = [];
    let summaryRequest: FormatDocuments[F] | undefined;
    if (format === "neutral" && r.summaryRequest.length) summaryRequest = r.summaryRequest.map(renderedFromPb) as FormatDocuments[F];
    else if (format !== "neutral" && r.summaryRequestJson) summaryRequest = JSON.parse(r.summaryRequestJson) as FormatDocuments[F];
    return {
      needed: r.needed,
      compactionId: r.compactionId,
      baseHeadId: r.baseHeadId,
      coversIds: r.coversIds,
      priorSummaryId: r.priorSummaryId,
      summaryInput,
      rendered,
      tokensBefore: r.tokensBefore,
      inputTokens: r.inputTokens,
      reason: r.reason,
      historyBudget: r.historyBudget,
      retainedTurns: r.retainedTurns,
      kind: summaryKind(r.kind),
      rollsOverIds: r.rollsOverIds,
      ledger: r.ledger,
      ledgerText: r.ledgerText,
      ...(summaryRequest === undefined ? {} : { summaryRequest }),
    };
  }

  /** Lays the summary over the prepared range if that strictly shrinks the context. A summary
   * that would not is an answer (`applied: false`, `reason`), not an error. */
  async commitSummary(compaction: Compaction | string, text: string, model: string): Promise<Outcome> {
    const request = { compactionId: compactionId(compaction), text, model };
    return outcomeFromPb(await this.#call<pb.CompactionOutcome>((m, o, cb) => this.raw.commitSummary(request, m, o, cb)));
  }

  /** Records that a prepared compaction will not be committed. */
  async cancelCompaction(compaction: Compaction | string, reason = ""): Promise<void> {
    const request = { compactionId: compactionId(compaction), reason };
    await this.#call<pb.CancelCompactionResponse>((m, o, cb) => this.raw.cancelCompaction(request, m, o, cb));
  }

  /** Prepare, the server's own summarizer, and commit in one call; needs a server started with
   * `--summarizer-url` (else FailedPreconditionError). `requestForm` is how the summarizer is
   * asked: `cache_sharing` (the context as the host renders it with `policy`, then the
   * instruction) or `range` (the covered range alone); absent, the server chooses. */
  async compact(
    session: SessionRef,
    budget: BudgetLike,
    options: CompactionOptions & { requestForm?: SummaryRequestForm } = {},
  ): Promise<Outcome> {
    const request: pb.CompactRequest = {
      sessionId: sessionId(session),
      branch: options.branch ?? "main",
      budget: budgetToPb(budget),
      tokenizer: options.tokenizer ?? "",
      retainTurns: options.retainTurns ?? 0,
      instructions: options.instructions ?? "",
      maxToolResultChars: options.maxToolResultChars ?? 0,
      fromNodeId: options.fromNodeId ?? "",
      toNodeId: options.toNodeId ?? "",
      requestForm:
        options.requestForm === undefined
          ? pb.SummaryRequestForm.SUMMARY_REQUEST_FORM_UNSPECIFIED
          : choice(SUMMARY_REQUEST_FORMS, options.requestForm, "requestForm"),
      policy: options.policy === undefined ? undefined : policyToPb(options.policy),
    };
    return outcomeFromPb(await this.#call<pb.CompactionOutcome>((m, o, cb) => this.raw.compact(request, m, o, cb)));
  }

  /** Every summary of the session and every compaction event on `branch`: the audit trail. */
  async listSummaries(session: SessionRef, branch = "main"): Promise<Summaries> {
    const request = { sessionId: sessionId(session), branch };
    return summariesFromPb(await this.#call<pb.ListSummariesResponse>((m, o, cb) => this.raw.listSummaries(request, m, o, cb)));
  }

  /** Pins nodes (never reduced by a render, shown verbatim after a summary); returns every
   * pinned node of the session, oldest pin first. */
  async pin(session: SessionRef, nodeIds: string[]): Promise<string[]> {
    const request = { sessionId: sessionId(session), nodeIds };
    return (await this.#call<pb.PinResponse>((m, o, cb) => this.raw.pin(request, m, o, cb))).pinnedIds;
  }

  async unpin(session: SessionRef, nodeIds: string[]): Promise<string[]> {
    const request = { sessionId: sessionId(session), nodeIds };
    return (await this.#call<pb.PinResponse>((m, o, cb) => this.raw.unpin(request, m, o, cb))).pinnedIds;
  }

  // ------------------------------------------------------------ sub-agents

  /**
   * Runs a sub-agent (function) answering the pending tool call `callId`: appends the
   * function_call, runs `body` with a handle that appends into the function's own chain, and
   * appends the function_result with what `body` returns. If `body` throws, the calls it left
   * unanswered get error results (the server will not close a function over them), the function
   * closes with status `error`, and the error is rethrown.
   */
  async runFunction(
    session: SessionRef,
    callId: string,
    input: string,
    body: (fn: FunctionHandle) => Promise<string>,
    options: { expose?: Expose; branch?: string; parentFunctionId?: string } = {},
  ): Promise<{ functionId: string; result: Appended; output: string }> {
    const caller: AppendOptions = options.parentFunctionId ? { functionId: options.parentFunctionId } : { branch: options.branch ?? "main" };
    const opened = await this.append(session, [{ type: "functionCall", callId, input, expose: options.expose ?? "io" }], caller);
    const fn = new FunctionHandle(this, sessionId(session), opened.nodeId);
    let output: string;
    try {
      output = await body(fn);
    } catch (error) {
      const failure = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
      try {
        // The error results in the function's chain and the close on the caller's, together.
        const pending = await pendingCalls(this, fn.sessionId, fn.functionId);
        const answers = pending.map((id) => toolResult(id, `not run: the sub-agent stopped (${failure})`, { isError: true }));
        await this.#appendAll(session, [
          ...(answers.length ? [{ nodes: answers, functionId: fn.functionId }] : []),
          { nodes: [{ type: "functionResult", callId, output: failure, status: "error" }], ...caller },
        ]);
      } catch (closing) {
        // The sub-agent's own error is the one that matters: keep it, and say what else failed.
        if (error instanceof Error) error.message += ` (ctxd: the function call could not be closed: ${String(closing)})`;
      }
      throw error;
    }
    const result = await this.append(session, [{ type: "functionResult", callId, output, status: "completed" }], caller);
    return { functionId: opened.nodeId, result, output };
  }

  // ------------------------------------------------------------ import

  /** Imports a session file (neutral JSONL, a Claude Code session, an OpenAI `messages` array,
   * or a ctxd JSONL export) into a new session, streamed in chunks; all or nothing. */
  async importSession(source: { path: string } | { data: Uint8Array | string }, options: ImportOptions = {}): Promise<Imported> {
    const chunkBytes = options.chunkBytes ?? 1 << 20;
    if (!(chunkBytes > 0)) throw new TypeError("chunkBytes must be positive");
    const chunks: AsyncIterable<Buffer> | Iterable<Buffer> =
      "path" in source ? createReadStream(source.path, { highWaterMark: chunkBytes }) : slices(Buffer.from(source.data), chunkBytes);
    await this.#connect();
    let call!: grpc.ClientWritableStream<pb.ImportChunk>;
    const answer = new Promise<pb.ImportSessionResponse>((resolve, reject) => {
      call = this.raw.importSession(new grpc.Metadata(), this.#callOptions(), (error, response) => {
        if (error) return reject(this.#error(error));
        this.#connected = true;
        resolve(response);
      });
    });
    // If the server fails the call early, stop streaming and report its answer.
    let failed = false;
    answer.catch(() => {
      failed = true;
    });
    try {
      let first = true;
      const head = {
        format: options.format === undefined ? pb.ImportFormat.IMPORT_FORMAT_UNSPECIFIED : choice(IMPORT_FORMATS, options.format, "format"),
        metadata: options.metadata ?? {},
        idempotencyKey: options.idempotencyKey ?? "",
      };
      for await (const data of chunks) {
        if (failed) break;
        const chunk: pb.ImportChunk = first ? { ...head, data } : { format: 0, metadata: {}, idempotencyKey: "", data };
        first = false;
        if (!call.write(chunk)) await Promise.race([once(call, "drain"), answer.catch(() => undefined)]);
      }
      if (first && !failed) call.write({ ...head, data: Buffer.alloc(0) });
    } catch (error) {
      call.cancel();
      throw error;
    }
    call.end();
    return importedFromPb(await answer);
  }

  // ------------------------------------------------------------ export

  /**
   * Streams a session out at one consistent head, as it is written: the file is the
   * concatenation of the chunks' `data`; the first chunk carries the heads (`branches`) and what
   * the format could not carry (`warnings`). `ctxd` (the default) is the whole session, which
   * `importSession` reads back (`format: "ctxd"`) into an equivalent one; `openai` and
   * `claude-code` are one branch (`branch`, default `main`). Leaving the loop early cancels the
   * export; `timeoutMs` bounds the whole stream.
   */
  async *exportSession(session: SessionRef, options: ExportOptions = {}): AsyncGenerator<ExportChunk> {
    const request: pb.ExportSessionRequest = {
      sessionId: sessionId(session),
      format: choice(EXPORT_FORMATS, options.format ?? "ctxd", "format"),
      branch: options.branch ?? "",
    };
    const chunks = this.#stream(() => this.raw.exportSession(request, new grpc.Metadata(), this.#callOptions()));
    for await (const c of chunks) yield { data: c.data, branches: c.branches.map(branchFromPb), warnings: c.warnings };
  }

  /** `exportSession` into a file, written beside it under a temporary name and renamed into
   * place once complete, so a failed export leaves whatever was at `path` untouched. */
  async exportToFile(session: SessionRef, path: string, options: ExportOptions = {}): Promise<Exported> {
    const exported: Exported = { path, bytes: 0, branches: [], warnings: [] };
    const chunks = this.exportSession(session, options);
    async function* data(): AsyncGenerator<Buffer> {
      let first = true;
      for await (const chunk of chunks) {
        if (first) [exported.branches, exported.warnings] = [chunk.branches, chunk.warnings];
        first = false;
        exported.bytes += chunk.data.length;
        yield chunk.data;
      }
    }
    const partial = join(dirname(path), `.${basename(path)}.${randomBytes(6).toString("hex")}.partial`);
    try {
      await pipeline(data(), createWriteStream(partial, { flags: "wx" }));
      await rename(partial, path);
    } catch (error) {
      await rm(partial, { force: true });
      throw error;
    }
    return exported;
  }

  // ------------------------------------------------------------ watch

  /**
   * Follows a session (or one `branch`) as it changes: an async iterable of events in commit
   * order per branch, starting with `started`. Each event carries the `cursor` to resume after
   * it. When the stream fails after it started (the connection dropped, the server restarted,
   * or it ended a reader that fell behind: UNAVAILABLE or RESOURCE_EXHAUSTED), the watch resumes
   * by itself after the last event it gave you, so none is lost or repeated; the server's
   * `started` of a resumed stream is not repeated either. Other failures, a failure before the
   * first event, and `maxReconnects` failed attempts in a row reject with the CtxdError. The
   * iterable ends after a `deleted` event, when you leave the loop, or when `signal` aborts.
   * `timeoutMs` does not apply: a watch lasts until you stop it.
   */
  async *watch(session: SessionRef, options: WatchOptions = {}): AsyncGenerator<WatchEvent> {
    const id = sessionId(session);
    const maxReconnects = options.maxReconnects ?? DEFAULT_MAX_RECONNECTS;
    const signal = options.signal;
    let cursor = options.afterCursor ?? "";
    let started = false;
    let failures = 0;
    while (!signal?.aborted) {
      const request: pb.WatchRequest = {
        sessionId: id,
        branch: options.branch ?? "",
        afterCursor: cursor,
        // Only until the first cursor: after that the cursor says where we are.
        afterNodeId: cursor ? "" : (options.afterNodeId ?? ""),
      };
      try {
        for await (const raw of this.#stream(() => this.raw.watch(request, new grpc.Metadata(), {}), signal)) {
          failures = 0;
          const event = watchEventFromPb(raw);
          // The cursor of the last event handed over: what a resume continues after.
          cursor = event.cursor;
          if (event.type === "started" && started) continue;
          started = true;
          if (signal?.aborted) return;
          yield event;
        }
        return; // the server ended the watch: the session was deleted
      } catch (error) {
        if (signal?.aborted) return;
        if (!(error instanceof CtxdError) || !started || !RESUMABLE.has(error.code) || ++failures > maxReconnects) throw error;
        options.onReconnect?.(error, failures);
        // The first attempt at once (a dropped connection is usually back), then backing off.
        await sleep(failures === 1 ? 0 : Math.min(5_000, 100 * 2 ** (failures - 2)), signal);
      }
    }
  }

  // ------------------------------------------------------------ admin

  /** Admin (a key marked `admin`, or any caller of a server without keys): copies the SQLite
   * database online, consistent at one moment, into `to`, an absolute path on the server's
   * machine that must not exist yet (else AlreadyExistsError). */
  async backupDatabase(to: string): Promise<Backup> {
    const r = await this.#call<pb.BackupDatabaseResponse>((m, o, cb) => this.raw.backupDatabase({ to }, m, o, cb));
    return { path: r.path, bytes: r.bytes, tookMs: r.tookMs };
  }

  /** Admin: gives the space deleted sessions left back to the operating system, and reports the
   * store's size. */
  async collectGarbage(): Promise<GarbageCollected> {
    const r = await this.#call<pb.CollectGarbageResponse>((m, o, cb) => this.raw.collectGarbage({}, m, o, cb));
    return {
      sessions: r.sessions,
      tombstones: r.tombstones,
      databaseBytes: r.databaseBytes,
      freeBytes: r.freeBytes,
      releasedBytes: r.releasedBytes,
    };
  }
}

/** A running function's own chain; see `Client.runFunction`. */
export class FunctionHandle {
  constructor(
    readonly client: Client,
    readonly sessionId: string,
    /** The function_call node: render its chain with `{ functionId }`. */
    readonly functionId: string,
  ) {}

  append(nodes: NodeInput[], options: Omit<AppendOptions, "branch" | "functionId"> = {}): Promise<Appended> {
    return this.client.append(this.sessionId, nodes, { ...options, functionId: this.functionId });
  }

  /** `Client.appendMany` into this function's chain. */
  appendMany(
    batches: Iterable<NodeInput[] | FunctionAppendRequest> | AsyncIterable<NodeInput[] | FunctionAppendRequest>,
    options: Pick<AppendOptions, "pinned"> = {},
  ): Promise<Appended[]> {
    return this.client.appendMany(this.sessionId, batches, { ...options, functionId: this.functionId });
  }

  appendUser(content: Content, options: NodeOptions = {}): Promise<Appended> {
    return this.append([userMessage(content, options)]);
  }

  appendAssistant(content: Content, toolCalls: ToolCallInput[] = [], options: NodeOptions = {}): Promise<Appended> {
    return this.append([assistantMessage(content, toolCalls, options)]);
  }

  appendToolResult(callId: string, content: Content, options: NodeOptions & { isError?: boolean } = {}): Promise<Appended> {
    return this.append([toolResult(callId, content, options)]);
  }

  /** A nested sub-agent answering a pending tool call of this function's chain. */
  runFunction(callId: string, input: string, body: (fn: FunctionHandle) => Promise<string>, options: { expose?: Expose } = {}) {
    return this.client.runFunction(this.sessionId, callId, input, body, { ...options, parentFunctionId: this.functionId });
  }

  /** Answers the calls of the chain's latest assistant message that have no result yet. */
  async answerPending(text: string): Promise<void> {
    const pending = await pendingCalls(this.client, this.sessionId, this.functionId);
    if (pending.length) await this.append(pending.map((id) => toolResult(id, text, { isError: true })));
  }
}

/** A request of `FunctionHandle.appendMany`: always into the function's chain. */
export type FunctionAppendRequest = Omit<AppendManyRequest, "branch" | "functionId">;

/** The calls of a function chain's latest assistant message that have no result yet. */
async function pendingCalls(client: Client, session: string, functionId: string): Promise<string[]> {
  const { rendered } = await client.render(session, { functionId, callers: "none", format: "neutral" });
  const answered = new Set<string>();
  for (const m of rendered.filter((m: RenderedMessage) => m.functionId === functionId).reverse()) {
    if (m.role === "tool") {
      answered.add(m.toolCallId);
      continue;
    }
    if (m.role === "assistant") return m.toolCalls.map((c) => c.id).filter((id) => !answered.has(id));
    break;
  }
  return [];
}

/** The AppendRequest of `nodes` to `options`' target: a function's chain, else a branch. */
function appendRequest(session: string, nodes: NodeInput[], options: AppendOptions): pb.AppendRequest {
  const request: pb.AppendRequest = {
    sessionId: session,
    branch: options.functionId ? "" : (options.branch ?? "main"),
    functionId: options.functionId ?? "",
    idempotencyKey: options.idempotencyKey ?? "",
    nodes: nodes.map((n) => nodeInputToPb(n, options.pinned)),
  };
  if (options.expectedHeadId !== undefined) request.expectedHeadId = options.expectedHeadId;
  return request;
}

const STOPPED = Symbol("stopped");

/** The failures after which the server says a watch may resume with its cursor: a dropped
 * connection or a server shutting down (UNAVAILABLE), a reader that fell behind
 * (RESOURCE_EXHAUSTED). */
const RESUMABLE = new Set<grpc.status>([grpc.status.UNAVAILABLE, grpc.status.RESOURCE_EXHAUSTED]);

function isServiceError(error: unknown): error is grpc.ServiceError {
  return error instanceof Error && typeof (error as Partial<grpc.ServiceError>).code === "number" && "metadata" in error;
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  if (ms <= 0 || signal?.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** `batches` converted as they are read, so a long import is never held whole. */
async function* converted<T, U>(batches: Iterable<T> | AsyncIterable<T>, convert: (batch: T, index: number) => U): AsyncGenerator<U> {
  let index = 0;
  for await (const batch of batches) yield convert(batch, index++);
}

/** Until `stream` drains its send buffer or `ended` settles (nothing more will drain then). */
async function drained(stream: NodeJS.EventEmitter, ended: Promise<unknown>): Promise<void> {
  let resolveDrain!: () => void;
  const drain = new Promise<void>((resolve) => (resolveDrain = resolve));
  stream.once("drain", resolveDrain);
  try {
    await Promise.race([drain, ended]);
  } finally {
    stream.removeListener("drain", resolveDrain);
  }
}

function compactionId(compaction: Compaction | string): string {
  return typeof compaction === "string" ? compaction : compaction.compactionId;
}

function* slices(data: Buffer, size: number): Iterable<Buffer> {
  for (let at = 0; at < data.length; at += size) yield data.subarray(at, at + size);
}

/** A provider document from its JSON. Empty means a server that predates provider formats:
 * failing loudly beats handing a model an empty conversation. */
function document(json: string, rpc: string, field: string): unknown {
  if (!json) throw ctxdError(grpc.status.UNIMPLEMENTED, `${rpc} answered no ${field}; the server does not support provider formats`);
  return JSON.parse(json);
}
