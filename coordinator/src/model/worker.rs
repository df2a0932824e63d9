//! The coordinator's record of a worker machine.

pub use crate::model::ids::WorkerId;
use serde::{Deserialize, Serialize};

use crate::model::hardware::{Gpu, SlotCap};

/// What a worker told us about itself, and what it did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Its id.
    pub id: WorkerId,
    /// The name it gave (host name by default).
    pub name: String,
    /// Render slots.
    pub slots: u32,
    /// Device kind it renders with.
    pub device: String,
    /// Blender's version line.
    pub blender_version: String,
    /// CPU cores.
    pub cpu_cores: u32,
    /// When it registered (ms since the epoch).
    pub registered_ms: u64,
    /// Last contact (ms since the epoch); kept in memory, written at registration.
    pub last_seen_ms: u64,
    /// Tasks it completed.
    pub tasks_done: u64,
    /// Tasks it failed.
    pub tasks_failed: u64,
    /// Its GPUs, with their latest telemetry.
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// What each slot renders with.
    #[serde(default)]
    pub slot_caps: Vec<SlotCap>,
    /// Tags jobs can require.
    #[serde(default)]
    pub tags: Vec<String>,
    /// System memory, bytes.
    #[serde(default)]
    pub memory_bytes: u64,
    /// What its hardware probe noted.
    #[serde(default)]
    pub notes: Vec<String>,
    /// What its Blender offers (see [`crate::model::hardware::FEATURES`]).
    #[serde(default)]
    pub features: Vec<String>,
    /// The Blenders it offers, newest first (see [`crate::model::runtime`]).
    #[serde(default)]
    pub runtimes: Vec<crate::model::runtime::Runtime>,
    /// The user (token holder) that registered it: only that token may lease,
    /// report or send telemetry for it. Empty for records older than this
    /// field, which no token owns.
    #[serde(default)]
    pub owner: String,
    /// What the whole machine costs per hour; each slot costs an equal share.
    #[serde(default)]
    pub price_per_hour: f64,
    /// How its capacity is bought.
    #[serde(default)]
    pub capacity: crate::model::usage::Capacity,
    /// Registered with `--untrusted`: its tasks are verified at the
    /// coordinator's `--verify-untrusted`.
    #[serde(default)]
    pub untrusted: bool,
    /// Where its frames disagreed with two other workers' (see
    /// [`crate::model::verify`]); it takes no more tasks of those requirement classes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspect: Vec<crate::model::verify::Suspicion>,
}

impl WorkerRecord {
    /// The capability of slot `slot` (a CPU slot when it never said).
    pub fn slot_cap(&self, slot: u32) -> SlotCap {
        self.slot_caps
            .iter()
            .find(|s| s.slot == slot)
            .copied()
            .unwrap_or(SlotCap {
                slot,
                ..SlotCap::default()
            })
    }
}
