//! The gRPC contract every door shares: the code generated from `proto/ctxd/v1/ctxd.proto`
//! (`pb`: the service the `api` door implements, the client the `cli` calls) and its JSON form
//! (`json`: the CLI's `--json`, the inspector's `/api`).

pub mod codec;
pub mod json;

/// Code generated from `proto/ctxd/v1/ctxd.proto`.
#[allow(clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("ctxd.v1");

    /// The encoded descriptors, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ctxd_descriptor");
}
