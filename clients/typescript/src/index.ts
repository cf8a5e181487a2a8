// The package's public surface: the client, node builders, the recall tool's definition and
// handler, plain types, errors, and the generated protobuf code (as `pb`) for the fields the wrapper does not cover.
export { Client, FunctionHandle } from "./client";
export type { AppendManyOptions, AppendManyRequest, AppendOptions, ClientOptions, CompactionOptions, ExportOptions, FunctionAppendRequest, ImportOptions, ListGatewayCallsOptions, ListSessionsOptions, RenderOptions, SessionFilter, StatsOptions, Target, TlsOptions, WatchOptions } from "./client";
export * from "./errors";
export * from "./nodes";
export * from "./recall";
export type * from "./types";
export { textOf } from "./types";
export * as pb from "./gen/ctxd/v1/ctxd";
export { status } from "@grpc/grpc-js";
