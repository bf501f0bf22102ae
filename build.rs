//! Compiles the kubelet's plugin APIs in proto/ with protox, a pure-Rust protobuf compiler, so a
//! fresh machine needs no protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/pluginregistration/api.proto",
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/dra-health/v1/api.proto",
        "proto/dra-health/v1alpha1/api.proto",
    ];
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    Ok(())
}
