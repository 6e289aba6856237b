//! Compiles every contract in `proto/` with tonic/prost and generates protobuf-JSON serde impls
//! (for kvmesh's own messages).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let mut protos: Vec<PathBuf> = [
        "llm",
        "worker",
        "events",
        "discovery",
        "indexer",
        "router",
        "processor",
    ]
    .iter()
    .map(|name| root.join(format!("kvmesh/v1/{name}.proto")))
    .collect();
    // The KServe v2 / Triton contract, package `inference`.
    protos.extend(
        ["grpc_service", "model_config"].map(|name| root.join(format!("kserve/{name}.proto"))),
    );
    println!("cargo:rerun-if-changed={}", root.display());
    println!("cargo:rerun-if-env-changed=PROTOC");

    let protoc = match std::env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    let include = protoc_bin_vendored::include_path()?;
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("kvmesh_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_with_config(
            config,
            &protos,
            &[root.clone(), root.join("kserve"), include],
        )?;

    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .preserve_proto_field_names()
        .build(&[".kvmesh"])?;
    Ok(())
}
