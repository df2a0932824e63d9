//! Deciding a worker's slots from its GPUs: one slot per NVIDIA GPU (OptiX
//! where the card supports it, CUDA otherwise), CPU slots when there is no
//! usable GPU, or the kind the user forces.
//!
//! `--fake-gpu "NAME:GB"` (feature `test-hooks`) declares a GPU that is not there, so that matching
//! and health can be tested on machines without one. A declared GPU's slot is
//! matched as that GPU, but renders on the CPU unless `--device cuda|optix`
//! forces the GPU device (then Blender is asked for it and fails honestly).

use crate::blender::Device;
use crate::gpu::GpuInfo;
#[cfg(any(test, feature = "test-hooks"))]
use crate::gpu::Telemetry;

/// Bytes in a GiB.
#[cfg(any(test, feature = "test-hooks"))]
const GIB: u64 = 1 << 30;

/// What the user asked for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// GPUs where there are usable ones, else CPU.
    Auto,
    /// This kind on every slot.
    Force(Device),
}

impl DeviceChoice {
    /// Parses `auto`, `cpu`, `cuda` or `optix`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Force(Device::Cpu)),
            "cuda" => Ok(Self::Force(Device::Cuda)),
            "optix" => Ok(Self::Force(Device::Optix)),
            other => Err(format!(
                "`{other}` is not a device; use auto, cpu, cuda or optix"
            )),
        }
    }
}

/// A GPU declared on the command line (`NAME:GB`), for tests.
#[cfg(any(test, feature = "test-hooks"))]
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredGpu {
    /// Product name.
    pub name: String,
    /// Memory, GiB.
    pub memory_gb: f64,
}

#[cfg(any(test, feature = "test-hooks"))]
impl std::str::FromStr for DeclaredGpu {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a GPU declaration; use NAME:GB, e.g. \"RTX 4090:24\"");
        let (name, gb) = s.rsplit_once(':').ok_or_else(bad)?;
        let memory_gb: f64 = gb.trim().parse().map_err(|_| bad())?;
        if name.trim().is_empty()
            || !(memory_gb.is_finite() && memory_gb > 0.0 && memory_gb <= 4096.0)
        {
            return Err(bad());
        }
        Ok(Self {
            name: name.trim().to_string(),
            memory_gb,
        })
    }
}

#[cfg(any(test, feature = "test-hooks"))]
impl DeclaredGpu {
    /// The GPU as if probed, at `index`.
    pub fn info(&self, index: u32) -> GpuInfo {
        GpuInfo {
            index,
            name: self.name.clone(),
            vendor: "NVIDIA".into(),
            vendor_id: 0x10de,
            device_type: "declared".into(),
            memory_bytes: (self.memory_gb * GIB as f64) as u64,
            uuid: format!("declared-{index}"),
            compute_capability: Some((8, 9)),
            telemetry: None,
        }
    }
}

/// One slot: what it renders with and on which GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotPlan {
    /// Slot number.
    pub slot: u32,
    /// The device jobs are matched against.
    pub device: Device,
    /// Index of its GPU in the worker's GPU list.
    pub gpu: Option<u32>,
    /// Its GPU's memory.
    pub vram_bytes: u64,
    /// The GPU's UUID, to pin Blender to it (`CUDA_VISIBLE_DEVICES`).
    pub uuid: Option<String>,
    /// A declared GPU (no hardware): render on the CPU unless forced.
    pub declared: bool,
}

/// Plans slots for `gpus` (probed and declared) and the user's choice.
/// `cpu_slots` is the number of slots when rendering on the CPU.
pub fn plan(
    gpus: &[GpuInfo],
    declared: &[bool],
    choice: DeviceChoice,
    cpu_slots: u32,
) -> Result<Vec<SlotPlan>, String> {
    let nvidia: Vec<(usize, &GpuInfo)> = gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| g.is_nvidia())
        .collect();
    let cpu = || {
        (0..cpu_slots.max(1))
            .map(|slot| SlotPlan {
                slot,
                device: Device::Cpu,
                gpu: None,
                vram_bytes: 0,
                uuid: None,
                declared: false,
            })
            .collect()
    };
    let gpu_slots = |kind: Option<Device>| -> Result<Vec<SlotPlan>, String> {
        nvidia
            .iter()
            .enumerate()
            .map(|(slot, (i, g))| {
                let device = match kind {
                    Some(Device::Optix) if !g.supports_optix() => {
                        return Err(format!(
                            "{} does not support OptiX; use --device cuda or auto",
                            g.name
                        ))
                    }
                    Some(d) => d,
                    None if g.supports_optix() => Device::Optix,
                    None => Device::Cuda,
                };
                Ok(SlotPlan {
                    slot: slot as u32,
                    device,
                    gpu: Some(g.index),
                    vram_bytes: g.memory_bytes,
                    uuid: (!g.uuid.is_empty()).then(|| g.uuid.clone()),
                    // Forced GPU devices are asked of Blender even on a declared GPU.
                    declared: kind.is_none() && declared.get(*i).copied().unwrap_or(false),
                })
            })
            .collect()
    };
    match choice {
        DeviceChoice::Force(Device::Cpu) => Ok(cpu()),
        DeviceChoice::Auto if nvidia.is_empty() => Ok(cpu()),
        DeviceChoice::Auto => gpu_slots(None),
        DeviceChoice::Force(d) if nvidia.is_empty() => Err(format!(
            "--device {} needs an NVIDIA GPU and none was found; use --device cpu or auto",
            d.name()
        )),
        DeviceChoice::Force(d) => gpu_slots(Some(d)),
    }
}

/// Reads declared GPUs' telemetry from a JSON file (an array, one object per
/// declared GPU, fields as in [`Telemetry`]); for tests of GPU health.
#[cfg(any(test, feature = "test-hooks"))]
pub fn read_declared_telemetry(path: &std::path::Path) -> Vec<Option<Telemetry>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let Ok(serde_json::Value::Array(items)) = serde_json::from_str::<serde_json::Value>(&text)
    else {
        tracing::warn!(
            "{} is not a JSON array of telemetry; ignoring it",
            path.display()
        );
        return Vec::new();
    };
    items
        .iter()
        .map(|v| {
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            Some(Telemetry {
                utilization_pct: n("utilization_pct").min(100) as u32,
                memory_used_bytes: n("memory_used_bytes"),
                temperature_c: n("temperature_c").min(1000) as u32,
                power_w: v["power_w"].as_f64().unwrap_or(0.0),
                ecc_errors: n("ecc_errors"),
                ecc_uncorrected: n("ecc_uncorrected"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(name: &str, gb: f64, index: u32) -> GpuInfo {
        DeclaredGpu {
            name: name.into(),
            memory_gb: gb,
        }
        .info(index)
    }

    #[test]
    fn declarations() {
        let g: DeclaredGpu = "RTX 4090:24".parse().unwrap();
        assert_eq!((g.name.as_str(), g.memory_gb), ("RTX 4090", 24.0));
        for bad in ["", "RTX", ":24", "RTX:x", "RTX:-1", "RTX:0"] {
            assert!(bad.parse::<DeclaredGpu>().is_err(), "{bad}");
        }
    }

    #[test]
    fn one_slot_per_nvidia_gpu_or_cpu_slots() {
        let gpus = vec![declared("A", 24.0, 0), declared("B", 12.0, 1)];
        let slots = plan(&gpus, &[true, true], DeviceChoice::Auto, 4).unwrap();
        assert_eq!(slots.len(), 2);
        assert_eq!(slots[0].device, Device::Optix);
        assert_eq!((slots[1].gpu, slots[1].vram_bytes), (Some(1), 12 << 30));
        let cpu = plan(&[], &[], DeviceChoice::Auto, 3).unwrap();
        assert_eq!(cpu.len(), 3);
        assert!(cpu
            .iter()
            .all(|s| s.device == Device::Cpu && s.vram_bytes == 0));
        assert_eq!(
            plan(&gpus, &[true, true], DeviceChoice::Force(Device::Cpu), 2)
                .unwrap()
                .len(),
            2
        );
        let cuda = plan(&gpus, &[true, true], DeviceChoice::Force(Device::Cuda), 1).unwrap();
        assert!(cuda.iter().all(|s| s.device == Device::Cuda));
        let err = plan(&[], &[], DeviceChoice::Force(Device::Optix), 1).unwrap_err();
        assert!(err.contains("needs an NVIDIA GPU"), "{err}");
    }

    #[test]
    fn declared_telemetry_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.json");
        std::fs::write(&p, r#"[{"temperature_c": 95, "ecc_errors": 3}, {}]"#).unwrap();
        let t = read_declared_telemetry(&p);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].unwrap().temperature_c, 95);
        assert_eq!(t[1].unwrap().temperature_c, 0);
        assert!(read_declared_telemetry(&dir.path().join("missing.json")).is_empty());
    }
}
