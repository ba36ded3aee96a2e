//! Generates the gRPC code from `proto/` with protox (a pure-Rust protobuf compiler), so building
//! needs no `protoc` on the machine.

#[cfg(not(feature = "messages"))]
fn main() {}

#[cfg(feature = "messages")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let file = root.join("governor/cluster/v1/cluster.proto");
    println!("cargo:rerun-if-changed={}", root.display());
    // The part of etcd's API the coordinator's etcd store uses (our own subset, see the file).
    let etcd = root.join("etcd/kv_lease.proto");
    let descriptors = protox::compile([&file, &etcd], [&root])?;
    // The services only with the transport (feature `grpc`); `messages` alone is prost's structs.
    let services = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_client(services)
        .build_server(services)
        // Smaller per-stream buffers than tonic's 8 KiB (see src/codec.rs).
        .codec_path("crate::codec::CompactCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
