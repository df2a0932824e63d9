//! Compiles the protocol with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = "proto/tessera/v1/tessera.proto";
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([file], ["proto"])?;
    // The messages a client sends as JSON to the HTTP API (`/api/v1/`), with
    // the proto field names; missing fields take their defaults and unknown
    // ones are refused, so a misspelt field is an error, not a silent default.
    let mut config = tonic_prost_build::configure();
    for message in [
        "JobSpec",
        "SceneInfo",
        "FileSet",
        "FileEntry",
        "PathMapping",
    ] {
        config = config.type_attribute(
            format!("tessera.v1.{message}"),
            "#[derive(serde::Deserialize)] #[serde(default, deny_unknown_fields)]",
        );
    }
    config.compile_fds(fds)?;
    Ok(())
}
