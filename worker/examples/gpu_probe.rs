//! Prints what the worker's hardware probe finds, and what NVML lists on its
//! own, as one JSON object on stdout: `scripts/gpu-check.sh` reads it to
//! show the GPUs and to check that each NVIDIA GPU's Vulkan UUID is one NVML
//! knows. An example rather than a `tessera` subcommand: it is a check for
//! people bringing up GPU machines, and needs no Blender or coordinator,
//! which a worker does.
//!
//!     cargo run --release -p tessera-worker --example gpu_probe

use nvml_wrapper::Nvml;
use serde_json::{json, Value};
use tessera_worker::gpu::Hardware;

fn main() {
    let hardware = Hardware::probe();
    let gpus: Vec<Value> = hardware
        .gpus()
        .iter()
        .map(|g| {
            json!({
                "index": g.index,
                "name": g.name,
                "vendor": g.vendor,
                "type": g.device_type,
                "memory_bytes": g.memory_bytes,
                "uuid": g.uuid,
                "nvidia": g.is_nvidia(),
                "optix": g.supports_optix(),
                "compute_capability": g.compute_capability.map(|(major, minor)| format!("{major}.{minor}")),
                "nvml_matched": g.telemetry.is_some(),
            })
        })
        .collect();
    // NVML's own list, independent of Vulkan: a GPU here whose UUID no
    // Vulkan device reports is one the worker would never give a slot.
    let nvml = match Nvml::init() {
        Ok(nvml) => {
            let count = nvml.device_count().unwrap_or(0);
            let devices: Vec<Value> = (0..count)
                .map(|i| match nvml.device_by_index(i) {
                    Ok(d) => json!({
                        "index": i,
                        "name": d.name().unwrap_or_default(),
                        "uuid": d.uuid().unwrap_or_default(),
                    }),
                    Err(e) => json!({"index": i, "error": e.to_string()}),
                })
                .collect();
            json!({"available": true, "devices": devices})
        }
        Err(e) => json!({"available": false, "error": e.to_string()}),
    };
    let out = json!({"gpus": gpus, "notes": hardware.notes(), "nvml": nvml});
    println!("{out:#}");
}
