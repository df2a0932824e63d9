//! Compiles the protocol with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = "proto/tessera/v1/tessera.proto";
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([file], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
