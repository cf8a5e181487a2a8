//! Compiles the gRPC contract with a vendored protoc, so a fresh machine needs no install step.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = tonic_prost_build::Config::new();
    // `$PROTOC` stays an override for machines that carry their own protoc.
    let protoc = match std::env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost's codec, except that an undecodable request is INVALID_ARGUMENT, not INTERNAL.
        .codec_path("crate::proto::codec::ProtoCodec")
        .file_descriptor_set_path(out_dir.join("ctxd_descriptor.bin"))
        .compile_with_config(config, &["proto/ctxd/v1/ctxd.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
