//! Workers' hardware as the coordinator sees it: GPUs and their telemetry,
//! what each slot renders with, what a job requires, and GPU health.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::model::runtime::{Runtime, VersionReq};

/// Bytes in a GiB; `--min-vram` is given in these units.
pub const GIB: f64 = (1u64 << 30) as f64;

/// How a slot renders, and what a job may require.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Device {
    /// CPU Cycles.
    #[default]
    Cpu,
    /// CUDA on an NVIDIA GPU.
    Cuda,
    /// OptiX on an NVIDIA GPU.
    Optix,
}

impl Device {
    /// Lowercase name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Optix => "optix",
        }
    }

    /// Parses `cpu`, `cuda` or `optix`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Some(Self::Cpu),
            "cuda" => Some(Self::Cuda),
            "optix" => Some(Self::Optix),
            _ => None,
        }
    }
}

/// Live readings of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Telemetry {
    /// Utilisation, percent.
    pub utilization_pct: u32,
    /// Memory in use, bytes.
    pub memory_used_bytes: u64,
    /// Temperature, °C.
    pub temperature_c: u32,
    /// Power draw, W.
    pub power_w: f64,
    /// Volatile ECC errors since the driver loaded.
    pub ecc_errors: u64,
    /// Of `ecc_errors`, the uncorrected ones.
    pub ecc_uncorrected: u64,
}

/// One GPU of a worker.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Gpu {
    /// Index in the worker's GPU list.
    pub index: u32,
    /// Product name.
    pub name: String,
    /// Vendor name.
    pub vendor: String,
    /// discrete, integrated, virtual, cpu or other.
    pub device_type: String,
    /// Device-local memory, bytes.
    pub memory_bytes: u64,
    /// Device UUID.
    pub uuid: String,
    /// Latest telemetry, where the worker has NVML.
    pub telemetry: Option<Telemetry>,
}

/// What one slot of a worker renders with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SlotCap {
    /// Slot number.
    pub slot: u32,
    /// Its device.
    pub device: Device,
    /// The GPU it is pinned to.
    pub gpu: Option<u32>,
    /// That GPU's memory, bytes (0 for CPU slots).
    pub vram_bytes: u64,
}

/// What a job needs from a slot.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Requirements {
    /// A device kind, or None for any.
    pub device: Option<Device>,
    /// Least GPU memory, bytes.
    pub min_vram_bytes: u64,
    /// Tags the worker must carry.
    pub tags: Vec<String>,
    /// Features the worker's Blender must have (see [`FEATURES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// The Blender versions that may render it (None: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blender: Option<VersionReq>,
}

/// Blender features a job may need, with how messages name them.
pub const FEATURES: [(&str, &str); 5] = [
    ("openimagedenoise", "OpenImageDenoise"),
    ("optix-denoise", "OptiX denoising"),
    ("osl", "OSL"),
    ("eevee", "EEVEE"),
    // Not a build property: the admin's choice (`worker --allow-scene-python`),
    // matched like one so such jobs run only on those workers.
    (
        SCENE_PYTHON,
        "the scene's stored Python allowed (a worker started with --allow-scene-python)",
    ),
];

/// The feature of a job that runs its scene's stored Python
/// (`submit --scene-python`); its tasks start Blender with `--enable-autoexec`.
pub const SCENE_PYTHON: &str = "scene-python";

impl Requirements {
    /// Validates user input: `device` is any/cpu/cuda/optix, `min_vram_gb` a
    /// sane number, tags short words.
    pub fn parse(device: &str, min_vram_gb: f64, tags: &[String]) -> Result<Self, Error> {
        let device = match device.trim() {
            "" | "any" => None,
            d => Some(Device::parse(d).ok_or_else(|| {
                Error::invalid(format!(
                    "`{d}` is not a device; use any, cpu, cuda or optix"
                ))
            })?),
        };
        if !(min_vram_gb.is_finite() && (0.0..=4096.0).contains(&min_vram_gb)) {
            return Err(Error::invalid(format!(
                "--min-vram {min_vram_gb} is not a memory size; give GB between 0 and 4096"
            )));
        }
        if device == Some(Device::Cpu) && min_vram_gb > 0.0 {
            return Err(Error::invalid(
                "a cpu job cannot require GPU memory; drop --min-vram or use --device cuda/optix",
            ));
        }
        if tags.len() > 16 {
            return Err(Error::invalid("more than 16 tags; use fewer"));
        }
        for t in tags {
            let ok = !t.is_empty()
                && t.len() <= 64
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                return Err(Error::invalid(format!(
                    "tag `{t}` is not a tag; use up to 64 letters, digits, `-`, `_` or `.`"
                )));
            }
        }
        let mut tags = tags.to_vec();
        tags.sort();
        tags.dedup();
        Ok(Self {
            device,
            min_vram_bytes: (min_vram_gb * GIB).round() as u64,
            tags,
            features: Vec::new(),
            blender: None,
        })
    }

    /// Adds the Blender features the scene needs, refusing unknown ones.
    pub fn with_features(mut self, features: &[String]) -> Result<Self, Error> {
        for f in features {
            if !FEATURES.iter().any(|(k, _)| k == f) {
                return Err(Error::invalid(format!(
                    "`{f}` is not a Blender feature; use {}",
                    FEATURES.map(|(k, _)| k).join(", ")
                )));
            }
        }
        self.features = features.to_vec();
        self.features.sort();
        self.features.dedup();
        Ok(self)
    }

    /// The runtime of a worker offering `runtimes` that renders the job:
    /// the newest whose version and features satisfy it.
    pub fn runtime_for<'a>(&self, runtimes: &'a [Runtime]) -> Option<&'a Runtime> {
        runtimes
            .iter()
            .filter(|r| {
                self.blender.is_none_or(|req| req.matches(r.version))
                    && self.features.iter().all(|f| r.features.contains(f))
            })
            .max_by_key(|r| r.version)
    }

    /// Whether the job runs its scene's stored Python ([`SCENE_PYTHON`]).
    pub fn scene_python(&self) -> bool {
        self.features.iter().any(|f| f == SCENE_PYTHON)
    }

    /// Whether a slot of a worker carrying `tags` can serve the job.
    pub fn satisfied_by(&self, slot: &SlotCap, tags: &[String]) -> bool {
        let device_ok = match self.device {
            None => true,
            Some(Device::Cpu) => slot.device == Device::Cpu,
            // A GPU that runs OptiX runs CUDA too.
            Some(Device::Cuda) => matches!(slot.device, Device::Cuda | Device::Optix),
            Some(Device::Optix) => slot.device == Device::Optix,
        };
        device_ok
            && slot.vram_bytes >= self.min_vram_bytes
            && self.tags.iter().all(|t| tags.contains(t))
    }

    /// The device a slot renders this job with.
    pub fn device_for(&self, slot: &SlotCap) -> Device {
        self.device.unwrap_or(slot.device)
    }

    /// `optix and 24 GB and tag studio`, for messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(d) = self.device {
            parts.push(d.name().to_string());
        }
        if self.min_vram_bytes > 0 {
            let gb = self.min_vram_bytes as f64 / GIB;
            parts.push(if gb.fract() == 0.0 {
                format!("{gb:.0} GB")
            } else {
                format!("{gb:.1} GB")
            });
        }
        for t in &self.tags {
            parts.push(format!("tag {t}"));
        }
        for f in &self.features {
            let name = FEATURES
                .iter()
                .find(|(k, _)| k == f)
                .map_or(f.as_str(), |(_, n)| n);
            parts.push(format!("a Blender with {name}"));
        }
        if parts.is_empty() {
            "any slot".into()
        } else {
            parts.join(" and ")
        }
    }
}

/// When a worker stops taking new work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthLimits {
    /// A GPU at or above this temperature drains its worker.
    pub max_temp_c: u32,
    /// More ECC errors than this within a day drain the worker.
    pub max_ecc_per_day: u64,
}

impl Default for HealthLimits {
    fn default() -> Self {
        Self {
            max_temp_c: 90,
            max_ecc_per_day: 10,
        }
    }
}

const DAY_MS: u64 = 24 * 3600 * 1000;

/// A worker's recent ECC readings, to tell a rising count from an old one.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// (time, ECC count) per GPU index, oldest first, one day deep.
    ecc: Vec<VecDeque<(u64, u64)>>,
    /// Why the worker is draining, while it is.
    pub drain: Option<String>,
}

impl Health {
    /// Takes new readings and decides whether the worker must drain. Returns
    /// the new drain reason (None when healthy).
    pub fn assess(&mut self, gpus: &[Gpu], limits: HealthLimits, now_ms: u64) -> Option<String> {
        if self.ecc.len() < gpus.len() {
            self.ecc.resize(gpus.len(), VecDeque::new());
        }
        let mut reasons = Vec::new();
        for (i, gpu) in gpus.iter().enumerate() {
            let Some(t) = gpu.telemetry else { continue };
            if t.temperature_c >= limits.max_temp_c {
                reasons.push(format!(
                    "GPU {} ({}) at {} °C (limit {} °C)",
                    gpu.index, gpu.name, t.temperature_c, limits.max_temp_c
                ));
            }
            let history = &mut self.ecc[i];
            // A count lower than before means the driver was reloaded: start over.
            if history.back().is_some_and(|&(_, c)| t.ecc_errors < c) {
                history.clear();
            }
            history.push_back((now_ms, t.ecc_errors));
            while history.len() > 1
                && history
                    .front()
                    .is_some_and(|&(at, _)| now_ms.saturating_sub(at) > DAY_MS)
            {
                history.pop_front();
            }
            let rise = t.ecc_errors - history.front().map_or(t.ecc_errors, |&(_, c)| c);
            if rise > limits.max_ecc_per_day {
                reasons.push(format!(
                    "GPU {} ({}) had {rise} ECC errors in the last day (limit {})",
                    gpu.index, gpu.name, limits.max_ecc_per_day
                ));
            }
        }
        self.drain = (!reasons.is_empty()).then(|| reasons.join("; "));
        self.drain.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(device: Device, gb: u64) -> SlotCap {
        SlotCap {
            slot: 0,
            device,
            gpu: None,
            vram_bytes: gb << 30,
        }
    }

    #[test]
    fn matching() {
        let tags = vec!["studio".to_string()];
        let optix24 = Requirements::parse("optix", 24.0, &[]).unwrap();
        assert!(optix24.satisfied_by(&slot(Device::Optix, 24), &[]));
        assert!(!optix24.satisfied_by(&slot(Device::Optix, 12), &[]));
        assert!(!optix24.satisfied_by(&slot(Device::Cuda, 48), &[]));
        let cuda = Requirements::parse("cuda", 0.0, &tags).unwrap();
        assert!(cuda.satisfied_by(&slot(Device::Optix, 8), &tags));
        assert!(!cuda.satisfied_by(&slot(Device::Optix, 8), &[]));
        assert!(!cuda.satisfied_by(&slot(Device::Cpu, 0), &tags));
        let any = Requirements::parse("any", 0.0, &[]).unwrap();
        assert!(any.satisfied_by(&slot(Device::Cpu, 0), &[]));
        assert_eq!(any.device_for(&slot(Device::Optix, 8)), Device::Optix);
        assert_eq!(cuda.device_for(&slot(Device::Optix, 8)), Device::Cuda);
        assert_eq!(optix24.describe(), "optix and 24 GB");
        assert_eq!(cuda.describe(), "cuda and tag studio");
    }

    #[test]
    fn bad_requirements() {
        assert!(Requirements::parse("metal", 0.0, &[])
            .unwrap_err()
            .to_string()
            .contains("use any, cpu, cuda or optix"));
        assert!(Requirements::parse("any", -1.0, &[]).is_err());
        assert!(Requirements::parse("any", f64::NAN, &[]).is_err());
        assert!(Requirements::parse("cpu", 8.0, &[]).is_err());
        assert!(Requirements::parse("any", 0.0, &["a b".into()]).is_err());
    }

    fn gpu(temp: u32, ecc: u64) -> Gpu {
        Gpu {
            name: "RTX".into(),
            telemetry: Some(Telemetry {
                temperature_c: temp,
                ecc_errors: ecc,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn heat_drains_and_cooling_restores() {
        let mut h = Health::default();
        let limits = HealthLimits::default();
        assert_eq!(h.assess(&[gpu(70, 0)], limits, 0), None);
        let why = h.assess(&[gpu(93, 0)], limits, 1000).unwrap();
        assert!(why.contains("93 °C (limit 90 °C)"), "{why}");
        assert_eq!(h.assess(&[gpu(80, 0)], limits, 2000), None);
    }

    #[test]
    fn rising_ecc_drains_until_a_day_has_passed() {
        let mut h = Health::default();
        let limits = HealthLimits::default();
        assert_eq!(
            h.assess(&[gpu(50, 100)], limits, 0),
            None,
            "an old count is not a rise"
        );
        assert_eq!(h.assess(&[gpu(50, 105)], limits, 1000), None);
        assert!(h
            .assess(&[gpu(50, 111)], limits, 2000)
            .unwrap()
            .contains("11 ECC errors"));
        assert!(h.assess(&[gpu(50, 111)], limits, DAY_MS).is_some());
        assert_eq!(h.assess(&[gpu(50, 111)], limits, DAY_MS + 3000), None);
    }
}
