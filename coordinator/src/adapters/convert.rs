//! Conversions between domain types and protocol messages.

use tessera_proto as pb;

use crate::digest::Digest;
use crate::error::Error;
use crate::farm::{Assignment, JobSnapshot, Registration, SceneInfo, Submission, WorkerSnapshot};
use crate::model::hardware::{Device, Gpu, SlotCap, Telemetry};
use crate::model::job::{JobId, JobState};
use crate::model::runtime::{Runtime, Version};
use crate::model::task::{FailureScope, FrameOutput, TaskState};
use crate::model::worker::WorkerId;

/// Parses a digest field, naming the field on error.
pub fn digest(field: &str, s: &str) -> Result<Digest, Error> {
    s.parse()
        .map_err(|e| Error::invalid(format!("{field}: {e}")))
}

impl TryFrom<pb::JobSpec> for Submission {
    type Error = Error;

    fn try_from(s: pb::JobSpec) -> Result<Self, Error> {
        Ok(Self {
            scene: digest("scene_digest", &s.scene_digest)?,
            scene_name: s.scene_name,
            frames: s.frames,
            chunk: s.chunk,
            priority: s.priority,
            max_attempts: s.max_attempts,
            tiles: s.tiles,
            overscan: s.overscan,
            scene_info: s.scene_info.map(|i| SceneInfo {
                width: i.width,
                height: i.height,
                file_format: i.file_format,
                fps: i.fps,
            }),
            device: s.device,
            min_vram_gb: s.min_vram_gb,
            tags: s.tags,
            features: s.features,
            blender: s.blender,
            file_set: match s.file_set_digest.as_str() {
                "" => None,
                d => Some(digest("file_set_digest", d)?),
            },
            // Set from the caller's token by the handler, never from the message.
            owner: String::new(),
            after: s.after,
            max_cost: s.max_cost,
            capacity: s.capacity.parse()?,
            preview: s.preview,
            verify: crate::model::verify::check_fraction("verify", s.verify)?,
        })
    }
}

impl TryFrom<pb::WorkerInfo> for Registration {
    type Error = Error;

    fn try_from(w: pb::WorkerInfo) -> Result<Self, Error> {
        Ok(Self {
            name: w.name,
            slots: w.slots,
            device: w.device,
            blender_version: w.blender_version,
            cpu_cores: w.cpu_cores,
            previous: (!w.previous_id.is_empty()).then_some(WorkerId(w.previous_id)),
            gpus: w.gpus.into_iter().map(Gpu::from).collect(),
            slot_caps: w.slot_info.iter().map(slot_cap).collect(),
            tags: w.tags,
            memory_bytes: w.memory_bytes,
            notes: w.notes,
            features: w.blender_features,
            runtimes: w
                .runtimes
                .into_iter()
                .map(runtime)
                .collect::<Result<_, _>>()?,
            untrusted: w.untrusted,
            // Set from the caller's token by the handler, never from the message.
            owner: String::new(),
            price_per_hour: crate::model::usage::check_price(w.price_per_hour)?,
            capacity: w.capacity.parse()?,
        })
    }
}

impl TryFrom<pb::FrameOutput> for FrameOutput {
    type Error = Error;

    fn try_from(o: pb::FrameOutput) -> Result<Self, Error> {
        Ok(Self {
            frame: o.frame,
            digest: digest("digest", &o.digest)?,
            ext: o.ext,
            size: o.size,
            pass: o.pass,
        })
    }
}

impl From<&FrameOutput> for pb::FrameOutput {
    fn from(o: &FrameOutput) -> Self {
        Self {
            frame: o.frame,
            digest: o.digest.to_hex(),
            ext: o.ext.clone(),
            size: o.size,
            pass: o.pass.clone(),
            data: None,
        }
    }
}

impl From<JobState> for pb::JobState {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Queued => Self::Queued,
            JobState::Running => Self::Running,
            JobState::Done => Self::Done,
            JobState::Failed => Self::Failed,
            JobState::Canceled => Self::Canceled,
            JobState::Paused => Self::Paused,
        }
    }
}

impl From<&JobSnapshot> for pb::JobView {
    fn from(s: &JobSnapshot) -> Self {
        let j = &s.job;
        let c = &s.counts;
        let tasks = s
            .tasks
            .iter()
            .map(|t| pb::TaskView {
                index: t.index,
                frames: t.frames.clone(),
                state: match t.state {
                    TaskState::Queued => pb::TaskState::Queued,
                    TaskState::Leased { .. } => pb::TaskState::Leased,
                    TaskState::Done { .. } => pb::TaskState::Done,
                    TaskState::Failed { .. } => pb::TaskState::Failed,
                    TaskState::Canceled => pb::TaskState::Canceled,
                } as i32,
                attempts: t.failures,
                worker_id: t.holder().map(|w| w.0.clone()).unwrap_or_default(),
                message: t.message.clone(),
                frames_done: t.frames_done,
                tile: t.tile.map(|tile| tile.index),
                samples_done: t.samples_done,
                samples_total: t.samples_total,
                attempt_log: t.attempts.iter().map(Into::into).collect(),
                verification: verification_word(t),
            })
            .collect();
        let frame_tiles = s
            .frame_tiles
            .iter()
            .map(|f| pb::FrameTiles {
                frame: f.frame,
                tiles_done: f.done,
                tiles_total: f.total,
                stitched: f.stitched,
            })
            .collect();
        Self {
            id: j.id.0,
            scene_name: j.scene_name.clone(),
            scene_digest: j.scene.to_hex(),
            frames: j.frames.clone(),
            chunk: j.chunk,
            priority: j.priority,
            state: pb::JobState::from(j.state) as i32,
            frames_total: j.frame_count,
            tasks_total: j.task_count,
            tasks_done: c.done,
            tasks_running: c.leased,
            tasks_failed: c.failed,
            message: j.message.clone(),
            created_ms: j.created_ms,
            finished_ms: j.finished_ms.unwrap_or(0),
            outputs: s.outputs.iter().map(Into::into).collect(),
            tasks,
            max_attempts: j.max_attempts,
            tiles: j.grid.to_string(),
            overscan: j.overscan,
            frame_tiles,
            device: j
                .requirements
                .device
                .map_or("any", Device::name)
                .to_string(),
            min_vram_gb: j.requirements.min_vram_bytes as f64 / crate::model::hardware::GIB,
            tags: j.requirements.tags.clone(),
            waiting: s.waiting.clone().unwrap_or_default(),
            owner: j.owner.clone(),
            file_set_digest: j.file_set.map(|d| d.to_hex()).unwrap_or_default(),
            missing_files: j.missing_files.clone(),
            features: j.requirements.features.clone(),
            blender: j
                .requirements
                .blender
                .map(|b| b.to_string())
                .unwrap_or_default(),
            frames_done: c.frames_done,
            outputs_total: c.outputs,
            running_frames_done: c.running_frames_done,
            samples_done: c.samples_done,
            samples_total: c.samples_total,
            archived: s.archived,
            after: j.after.iter().map(|a| a.0).collect(),
            waiting_for: s.waiting_for.map_or(0, |j| j.0),
            max_cost: j.max_cost,
            capacity: j.capacity.name().into(),
            usage: Some((&s.usage).into()),
            preview: preview_view(&j.preview),
            fps: j.preview.fps.unwrap_or(0.0),
            warnings: j.warnings.clone(),
            frame_stats: frame_stats(&s.tasks),
            verify: j.verify,
            tasks_verifying: s
                .tasks
                .iter()
                .filter(|t| t.verify.as_ref().is_some_and(|v| !v.candidates.is_empty()))
                .count() as u32,
            // The farm's, not the job's: filled by the handler.
            outages: Vec::new(),
        }
    }
}

impl From<&crate::model::usage::Attempt> for pb::AttemptView {
    fn from(a: &crate::model::usage::Attempt) -> Self {
        Self {
            worker_id: a.worker.0.clone(),
            grant: a.grant,
            seconds: a.ms as f64 / 1000.0,
            gpu: a.gpu,
            price_per_hour: a.price_per_hour,
            cost: a.cost(),
            end: a.end.name().into(),
        }
    }
}

/// Render statistics of the done tasks among `tasks`, by frame (and tile).
fn frame_stats(tasks: &[std::sync::Arc<crate::model::task::Task>]) -> Vec<pb::FrameStats> {
    let mut out: Vec<pb::FrameStats> = tasks
        .iter()
        .filter(|t| t.is_done())
        .flat_map(|t| {
            t.stats.iter().map(|s| pb::FrameStats {
                frame: s.frame,
                render_ms: s.render_ms,
                sync_ms: s.sync_ms,
                samples: s.samples,
                memory_peak_bytes: s.memory_peak_bytes,
                tile: t.tile.map(|tile| tile.index),
            })
        })
        .collect();
    out.sort_by_key(|s| (s.frame, s.tile));
    out
}

/// A task's verification in a few words, for `status` (empty when none).
fn verification_word(t: &crate::model::task::Task) -> String {
    let Some(v) = &t.verify else {
        return String::new();
    };
    let names = |ws: &mut dyn Iterator<Item = &WorkerId>| -> String {
        ws.map(|w| w.0.as_str()).collect::<Vec<_>>().join(", ")
    };
    if v.settled() {
        let mut s = format!("verified by {}", names(&mut v.agreed.iter()));
        if !v.odd.is_empty() {
            s += &format!("; differed: {}", names(&mut v.odd.iter()));
        }
        s
    } else if v.disputed() {
        format!(
            "disputed: {} results differ ({})",
            v.candidates.len(),
            names(&mut v.candidates.iter().map(|c| &c.worker))
        )
    } else if v.candidates.is_empty() {
        String::new()
    } else {
        format!(
            "verifying: result of {} held",
            names(&mut v.candidates.iter().map(|c| &c.worker))
        )
    }
}

impl From<crate::model::verify::FrameStats> for pb::FrameStats {
    fn from(s: crate::model::verify::FrameStats) -> Self {
        Self {
            frame: s.frame,
            render_ms: s.render_ms,
            sync_ms: s.sync_ms,
            samples: s.samples,
            memory_peak_bytes: s.memory_peak_bytes,
            tile: None,
        }
    }
}

impl From<&pb::FrameStats> for crate::model::verify::FrameStats {
    fn from(s: &pb::FrameStats) -> Self {
        Self {
            frame: s.frame,
            render_ms: s.render_ms,
            sync_ms: s.sync_ms,
            samples: s.samples,
            memory_peak_bytes: s.memory_peak_bytes,
        }
    }
}

impl From<&crate::model::usage::Usage> for pb::JobUsage {
    fn from(u: &crate::model::usage::Usage) -> Self {
        let hours = |ms: u64| ms as f64 / 3_600_000.0;
        Self {
            gpu_hours: hours(u.gpu_ms),
            cpu_hours: hours(u.cpu_ms),
            cost: u.cost,
            failed_hours: hours(u.failed_ms),
            failed_cost: u.failed_cost,
            preempted_hours: hours(u.preempted_ms),
            preempted_cost: u.preempted_cost,
        }
    }
}

/// A job's preview as the protocol shows it; None when none was asked for.
fn preview_view(p: &crate::model::preview::Preview) -> Option<pb::PreviewView> {
    use crate::model::preview::Outcome;
    let state = p.state_name()?.to_string();
    Some(match &p.outcome {
        Some(Outcome::Ready(v)) => pb::PreviewView {
            state,
            digest: v.digest.to_hex(),
            size: v.size,
            frames: v.frames,
            width: v.width,
            height: v.height,
            fps: v.fps,
            message: v.note.clone(),
        },
        Some(Outcome::Failed(why)) => pb::PreviewView {
            state,
            message: why.clone(),
            ..Default::default()
        },
        None => pb::PreviewView {
            state,
            fps: p.fps_or_fallback().0,
            ..Default::default()
        },
    })
}

/// The page a job reference asks for, capped.
pub fn page(r: &pb::JobRef) -> crate::farm::Page {
    crate::farm::Page {
        task_from: r.task_from,
        task_limit: r.task_limit,
        output_from: r.output_from,
        output_limit: r.output_limit,
    }
    .capped()
}

impl From<&WorkerSnapshot> for pb::WorkerView {
    fn from(w: &WorkerSnapshot) -> Self {
        let r = &w.record;
        Self {
            id: r.id.0.clone(),
            name: r.name.clone(),
            slots: r.slots,
            device: r.device.clone(),
            blender_version: r.blender_version.clone(),
            state: match (w.online, &w.drain) {
                (false, _) => "offline",
                (true, Some(_)) => "draining",
                (true, None) => "online",
            }
            .into(),
            last_seen_ms: r.last_seen_ms,
            tasks_running: w.running,
            tasks_done: r.tasks_done,
            tasks_failed: r.tasks_failed,
            cpu_cores: r.cpu_cores,
            gpus: r.gpus.iter().map(Into::into).collect(),
            slot_info: r
                .slot_caps
                .iter()
                .map(|c| pb::SlotInfo {
                    slot: c.slot,
                    device: c.device.name().into(),
                    gpu: c.gpu,
                    vram_bytes: c.vram_bytes,
                })
                .collect(),
            tags: r.tags.clone(),
            memory_bytes: r.memory_bytes,
            drain_reason: w.drain.clone().unwrap_or_default(),
            notes: r.notes.clone(),
            blender_features: r.features.clone(),
            runtimes: r.runtimes.iter().map(Into::into).collect(),
            tasks_in_hand: w.in_hand.iter().map(|(j, t)| format!("{j}.{t}")).collect(),
            price_per_hour: r.price_per_hour,
            capacity: r.capacity.name().into(),
            untrusted: r.untrusted,
            suspect: r
                .suspect
                .iter()
                .map(|s| s.reason.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

impl From<&Assignment> for pb::TaskAssignment {
    fn from(a: &Assignment) -> Self {
        Self {
            lease_id: a.lease.to_string(),
            job_id: a.lease.job.0,
            task_index: a.lease.task,
            scene_digest: a.scene.to_hex(),
            scene_name: a.scene_name.clone(),
            frames: a.frames.clone(),
            attempt: a.attempt,
            lease_ttl_ms: a.ttl_ms.min(u64::from(u32::MAX)) as u32,
            max_width: a.max_pixels.width,
            max_height: a.max_pixels.height,
            tile: a.tile.map(|t| pb::TileRegion {
                rendered: Some(pb::Rect {
                    x: t.rendered.x,
                    y: t.rendered.y,
                    w: t.rendered.w,
                    h: t.rendered.h,
                }),
                frame_width: t.frame.0,
                frame_height: t.frame.1,
                border_min_x: t.border.0,
                border_max_x: t.border.1,
                border_min_y: t.border.2,
                border_max_y: t.border.3,
            }),
            device: a.device.name().into(),
            file_set_digest: a.file_set.map(|d| d.to_hex()).unwrap_or_default(),
            blender: a.blender.map(|v| v.to_string()).unwrap_or_default(),
            scene_python: a.scene_python,
        }
    }
}

impl From<&Runtime> for pb::BlenderRuntime {
    fn from(r: &Runtime) -> Self {
        Self {
            version: r.version.to_string(),
            kind: r.kind.clone(),
            path: r.path.clone(),
            features: r.features.clone(),
            devices: r.devices.clone(),
        }
    }
}

/// A runtime a worker reported; its version must be one.
fn runtime(r: pb::BlenderRuntime) -> Result<Runtime, Error> {
    let version = Version::parse(&r.version).ok_or_else(|| {
        Error::invalid(format!(
            "runtime version `{}` is not a Blender version (e.g. 4.5.15)",
            r.version
        ))
    })?;
    Ok(Runtime {
        version,
        kind: r.kind,
        path: r.path,
        features: r.features,
        devices: r.devices,
    })
}

/// A slot's capability from the protocol (unknown devices read as CPU).
pub fn slot_cap(s: &pb::SlotInfo) -> SlotCap {
    SlotCap {
        slot: s.slot,
        device: Device::parse(&s.device).unwrap_or(Device::Cpu),
        gpu: s.gpu,
        vram_bytes: s.vram_bytes,
    }
}

impl From<pb::Gpu> for Gpu {
    fn from(g: pb::Gpu) -> Self {
        Self {
            index: g.index,
            name: g.name.chars().take(200).collect(),
            vendor: g.vendor.chars().take(100).collect(),
            device_type: g.device_type.chars().take(40).collect(),
            memory_bytes: g.memory_bytes,
            uuid: g.uuid.chars().take(100).collect(),
            telemetry: g.telemetry.map(|t| Telemetry {
                utilization_pct: t.utilization_pct.min(100),
                memory_used_bytes: t.memory_used_bytes,
                temperature_c: t.temperature_c,
                power_w: if t.power_w.is_finite() {
                    t.power_w
                } else {
                    0.0
                },
                ecc_errors: t.ecc_errors,
                ecc_uncorrected: t.ecc_uncorrected,
            }),
        }
    }
}

impl From<&Gpu> for pb::Gpu {
    fn from(g: &Gpu) -> Self {
        Self {
            index: g.index,
            name: g.name.clone(),
            vendor: g.vendor.clone(),
            device_type: g.device_type.clone(),
            memory_bytes: g.memory_bytes,
            uuid: g.uuid.clone(),
            telemetry: g.telemetry.map(|t| pb::Telemetry {
                utilization_pct: t.utilization_pct,
                memory_used_bytes: t.memory_used_bytes,
                temperature_c: t.temperature_c,
                power_w: t.power_w,
                ecc_errors: t.ecc_errors,
                ecc_uncorrected: t.ecc_uncorrected,
            }),
        }
    }
}

/// A job id from a request.
pub fn job_id(r: &pb::JobRef) -> JobId {
    JobId(r.job_id)
}

/// The failure scope a worker reported; an unset scope falls back to the
/// older `permanent` flag.
pub fn failure_scope(scope: i32, permanent: bool) -> FailureScope {
    match pb::FailureScope::try_from(scope).unwrap_or(pb::FailureScope::Unspecified) {
        pb::FailureScope::Transient => FailureScope::Transient,
        pb::FailureScope::Machine => FailureScope::Machine,
        pb::FailureScope::Everywhere => FailureScope::Everywhere,
        pb::FailureScope::Unspecified if permanent => FailureScope::Everywhere,
        pb::FailureScope::Unspecified => FailureScope::Transient,
    }
}
