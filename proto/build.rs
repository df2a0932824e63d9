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
            "#[derive(serde::Deserialize)] #[serde(default, deny_unknown_fields)] \
             #[cfg_attr(feature = \"openapi\", derive(serde::Serialize, utoipa::ToSchema))]",
        );
    }
    // With `openapi`, their JSON schemas for the coordinator's OpenAPI
    // document: utoipa writes serde's `default` values out through
    // Serialize, and these fields get examples or bounds beside their docs.
    for (field, schema) in [
        ("JobSpec.frames", r#"examples("1-250", "1,5,10-20")"#),
        ("JobSpec.tiles", r#"examples("2x2")"#),
        (
            "JobSpec.device",
            r#"examples("", "any", "cpu", "cuda", "optix")"#,
        ),
        (
            "JobSpec.capacity",
            r#"examples("", "spot-ok", "on-demand-only")"#,
        ),
        ("JobSpec.verify", "minimum = 0, maximum = 1"),
    ] {
        config = config.field_attribute(
            format!("tessera.v1.{field}"),
            format!("#[cfg_attr(feature = \"openapi\", schema({schema}))]"),
        );
    }
    config.compile_fds(fds)?;
    Ok(())
}
