//! The JSON form of job and worker views: one conversion, used by
//! `tessera status --json` (and `jobs`, `workers`) and by the coordinator's
//! HTTP API, so that both print the same object. States are lowercase
//! strings (`"running"`), digests lowercase hex. The views are serde types
//! ([`Job`], [`Worker`]); with the `openapi` feature they also derive their
//! JSON schemas for the coordinator's OpenAPI document.

use serde_json::Value;

use crate::v1 as pb;

/// A job state as a lowercase word (`"running"`), `"unknown"` for a value
/// this build does not know.
pub fn job_state(s: i32) -> String {
    pb::JobState::try_from(s)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("JOB_STATE_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| "unknown".into())
}

/// A task state as a lowercase word (`"leased"`).
pub fn task_state(s: i32) -> String {
    pb::TaskState::try_from(s)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("TASK_STATE_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| "unknown".into())
}

/// Sample progress of the renders in flight, as `12/64 samples` (empty when
/// none report samples).
pub fn samples(j: &pb::JobView) -> String {
    if j.samples_total == 0 {
        String::new()
    } else {
        format!("{}/{} samples", j.samples_done, j.samples_total)
    }
}

/// Derives the JSON schema of a view for the coordinator's OpenAPI document
/// (feature `openapi`) beside its serde form.
macro_rules! view {
    ($(#[$m:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, serde::Serialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub struct $name { $($body)* }
    };
}

view! {
    /// A job: its spec, state, progress, tasks, outputs and costs.
    pub struct Job {
        id: u64,
        scene: String,
        scene_digest: String,
        /// `queued`, `running`, `paused`, `done`, `failed` or `canceled`.
        state: String,
        frames: String,
        frames_total: u32,
        frames_done: u32,
        running_frames_done: u32,
        outputs_total: u32,
        archived: bool,
        chunk: u32,
        tiles: String,
        overscan: u32,
        frame_tiles: Vec<FrameTiles>,
        priority: i32,
        max_attempts: u32,
        tasks_total: u32,
        tasks_done: u32,
        tasks_running: u32,
        tasks_failed: u32,
        message: String,
        waiting: String,
        owner: String,
        file_set_digest: String,
        missing_files: Vec<String>,
        device: String,
        min_vram_gb: f64,
        tags: Vec<String>,
        features: Vec<String>,
        blender: String,
        /// What workers reported about how the frames were rendered, e.g. a
        /// driver that needs auto-run Python and was not evaluated.
        warnings: Vec<String>,
        /// What the farm depends on that does not answer now (GET of one job
        /// only), e.g. "blobs: S3 s3://renders/farm at http://s3:8333
        /// unreachable since 2026-12-04 14:30:00 UTC (connection refused)".
        outages: Vec<String>,
        created_ms: u64,
        finished_ms: Option<u64>,
        after: Vec<u64>,
        waiting_for: Option<u64>,
        max_cost: Option<f64>,
        /// `spot-ok` or `on-demand-only`.
        capacity: String,
        usage: Option<Usage>,
        outputs: Vec<Output>,
        fps: Option<f64>,
        preview: Option<Preview>,
        /// Sample progress of the renders in flight, as `12/64 samples`.
        samples: String,
        samples_done: u64,
        samples_total: u64,
        tasks: Vec<Task>,
        verify: f64,
        tasks_verifying: u32,
        frame_stats: Vec<FrameStat>,
    }
}

view! {
    /// A frame's tiles: how many are done, and whether they were stitched.
    pub struct FrameTiles {
        frame: u32,
        tiles_done: u32,
        tiles_total: u32,
        stitched: bool,
    }
}

view! {
    /// What a job's attempts cost.
    pub struct Usage {
        gpu_hours: f64,
        cpu_hours: f64,
        cost: f64,
        failed_hours: f64,
        failed_cost: f64,
        preempted_hours: f64,
        preempted_cost: f64,
    }
}

view! {
    /// A stored output: a frame (or one of its passes).
    pub struct Output {
        frame: u32,
        digest: String,
        ext: String,
        size: u64,
        pass: String,
    }
}

view! {
    /// A task: its frames (or tile), state, attempts and their log.
    pub struct Task {
        index: u32,
        frames: Vec<u32>,
        tile: Option<u32>,
        /// `queued`, `leased`, `done`, `failed` or `canceled`.
        state: String,
        attempts: u32,
        worker: String,
        frames_done: u32,
        samples_done: u32,
        samples_total: u32,
        message: String,
        attempt_log: Vec<Attempt>,
        verification: String,
    }
}

view! {
    /// One attempt at a task: where it ran, how long, what it cost, how it ended.
    pub struct Attempt {
        worker: String,
        grant: u32,
        seconds: f64,
        gpu: bool,
        price_per_hour: f64,
        cost: f64,
        end: String,
    }
}

view! {
    /// How one frame (or tile) rendered.
    pub struct FrameStat {
        frame: u32,
        tile: Option<u32>,
        render_ms: u64,
        sync_ms: u64,
        samples: u32,
        memory_peak_bytes: u64,
    }
}

view! {
    /// A job's preview video.
    pub struct Preview {
        /// `pending`, `ready` or `failed`.
        state: String,
        digest: String,
        size: u64,
        frames: u32,
        width: u32,
        height: u32,
        fps: f64,
        message: String,
    }
}

view! {
    /// A worker: slots, Blenders, GPUs with telemetry, health and drain reason.
    pub struct Worker {
        id: String,
        name: String,
        state: String,
        slots: u32,
        device: String,
        blender: String,
        blender_features: Vec<String>,
        runtimes: Vec<Runtime>,
        tasks_in_hand: Vec<String>,
        price_per_hour: f64,
        capacity: String,
        cpu_cores: u32,
        tasks_running: u32,
        tasks_done: u64,
        tasks_failed: u64,
        last_seen_ms: u64,
        memory_bytes: u64,
        tags: Vec<String>,
        drain_reason: String,
        untrusted: bool,
        suspect: String,
        notes: Vec<String>,
        slots_info: Vec<Slot>,
        gpus: Vec<Gpu>,
    }
}

view! {
    /// A Blender a worker offers.
    pub struct Runtime {
        version: String,
        kind: String,
        path: String,
        features: Vec<String>,
        devices: Vec<String>,
    }
}

view! {
    /// One render slot of a worker.
    pub struct Slot {
        slot: u32,
        device: String,
        gpu: Option<u32>,
        vram_bytes: u64,
    }
}

view! {
    /// A GPU of a worker, with its latest telemetry.
    pub struct Gpu {
        index: u32,
        name: String,
        vendor: String,
        #[serde(rename = "type")]
        device_type: String,
        memory_bytes: u64,
        uuid: String,
        telemetry: Option<Telemetry>,
    }
}

view! {
    /// A GPU's latest telemetry.
    pub struct Telemetry {
        utilization_pct: u32,
        memory_used_bytes: u64,
        temperature_c: u32,
        power_w: f64,
        ecc_errors: u64,
        ecc_uncorrected: u64,
    }
}

impl From<&pb::JobView> for Job {
    fn from(j: &pb::JobView) -> Self {
        Self {
            id: j.id,
            scene: j.scene_name.clone(),
            scene_digest: j.scene_digest.clone(),
            state: job_state(j.state),
            frames: j.frames.clone(),
            frames_total: j.frames_total,
            frames_done: j.frames_done,
            running_frames_done: j.running_frames_done,
            outputs_total: j.outputs_total,
            archived: j.archived,
            chunk: j.chunk,
            tiles: j.tiles.clone(),
            overscan: j.overscan,
            frame_tiles: j
                .frame_tiles
                .iter()
                .map(|f| FrameTiles {
                    frame: f.frame,
                    tiles_done: f.tiles_done,
                    tiles_total: f.tiles_total,
                    stitched: f.stitched,
                })
                .collect(),
            priority: j.priority,
            max_attempts: j.max_attempts,
            tasks_total: j.tasks_total,
            tasks_done: j.tasks_done,
            tasks_running: j.tasks_running,
            tasks_failed: j.tasks_failed,
            message: j.message.clone(),
            waiting: j.waiting.clone(),
            owner: j.owner.clone(),
            file_set_digest: j.file_set_digest.clone(),
            missing_files: j.missing_files.clone(),
            device: j.device.clone(),
            min_vram_gb: j.min_vram_gb,
            tags: j.tags.clone(),
            features: j.features.clone(),
            blender: j.blender.clone(),
            warnings: j.warnings.clone(),
            outages: j.outages.clone(),
            created_ms: j.created_ms,
            finished_ms: (j.finished_ms != 0).then_some(j.finished_ms),
            after: j.after.clone(),
            waiting_for: (j.waiting_for != 0).then_some(j.waiting_for),
            max_cost: j.max_cost,
            capacity: j.capacity.clone(),
            usage: j.usage.as_ref().map(|u| Usage {
                gpu_hours: u.gpu_hours,
                cpu_hours: u.cpu_hours,
                cost: u.cost,
                failed_hours: u.failed_hours,
                failed_cost: u.failed_cost,
                preempted_hours: u.preempted_hours,
                preempted_cost: u.preempted_cost,
            }),
            outputs: j
                .outputs
                .iter()
                .map(|o| Output {
                    frame: o.frame,
                    digest: o.digest.clone(),
                    ext: o.ext.clone(),
                    size: o.size,
                    pass: o.pass.clone(),
                })
                .collect(),
            fps: (j.fps > 0.0).then_some(j.fps),
            preview: j.preview.as_ref().map(Preview::from),
            samples: samples(j),
            samples_done: j.samples_done,
            samples_total: j.samples_total,
            tasks: j
                .tasks
                .iter()
                .map(|t| Task {
                    index: t.index,
                    frames: t.frames.clone(),
                    tile: t.tile,
                    state: task_state(t.state),
                    attempts: t.attempts,
                    worker: t.worker_id.clone(),
                    frames_done: t.frames_done,
                    samples_done: t.samples_done,
                    samples_total: t.samples_total,
                    message: t.message.clone(),
                    attempt_log: t
                        .attempt_log
                        .iter()
                        .map(|a| Attempt {
                            worker: a.worker_id.clone(),
                            grant: a.grant,
                            seconds: a.seconds,
                            gpu: a.gpu,
                            price_per_hour: a.price_per_hour,
                            cost: a.cost,
                            end: a.end.clone(),
                        })
                        .collect(),
                    verification: t.verification.clone(),
                })
                .collect(),
            verify: j.verify,
            tasks_verifying: j.tasks_verifying,
            frame_stats: j
                .frame_stats
                .iter()
                .map(|s| FrameStat {
                    frame: s.frame,
                    tile: s.tile,
                    render_ms: s.render_ms,
                    sync_ms: s.sync_ms,
                    samples: s.samples,
                    memory_peak_bytes: s.memory_peak_bytes,
                })
                .collect(),
        }
    }
}

impl From<&pb::PreviewView> for Preview {
    fn from(p: &pb::PreviewView) -> Self {
        Self {
            state: p.state.clone(),
            digest: p.digest.clone(),
            size: p.size,
            frames: p.frames,
            width: p.width,
            height: p.height,
            fps: p.fps,
            message: p.message.clone(),
        }
    }
}

impl From<&pb::WorkerView> for Worker {
    fn from(w: &pb::WorkerView) -> Self {
        Self {
            id: w.id.clone(),
            name: w.name.clone(),
            state: w.state.clone(),
            slots: w.slots,
            device: w.device.clone(),
            blender: w.blender_version.clone(),
            blender_features: w.blender_features.clone(),
            runtimes: w
                .runtimes
                .iter()
                .map(|r| Runtime {
                    version: r.version.clone(),
                    kind: r.kind.clone(),
                    path: r.path.clone(),
                    features: r.features.clone(),
                    devices: r.devices.clone(),
                })
                .collect(),
            tasks_in_hand: w.tasks_in_hand.clone(),
            price_per_hour: w.price_per_hour,
            capacity: w.capacity.clone(),
            cpu_cores: w.cpu_cores,
            tasks_running: w.tasks_running,
            tasks_done: w.tasks_done,
            tasks_failed: w.tasks_failed,
            last_seen_ms: w.last_seen_ms,
            memory_bytes: w.memory_bytes,
            tags: w.tags.clone(),
            drain_reason: w.drain_reason.clone(),
            untrusted: w.untrusted,
            suspect: w.suspect.clone(),
            notes: w.notes.clone(),
            slots_info: w
                .slot_info
                .iter()
                .map(|s| Slot {
                    slot: s.slot,
                    device: s.device.clone(),
                    gpu: s.gpu,
                    vram_bytes: s.vram_bytes,
                })
                .collect(),
            gpus: w
                .gpus
                .iter()
                .map(|g| Gpu {
                    index: g.index,
                    name: g.name.clone(),
                    vendor: g.vendor.clone(),
                    device_type: g.device_type.clone(),
                    memory_bytes: g.memory_bytes,
                    uuid: g.uuid.clone(),
                    telemetry: g.telemetry.map(|t| Telemetry {
                        utilization_pct: t.utilization_pct,
                        memory_used_bytes: t.memory_used_bytes,
                        temperature_c: t.temperature_c,
                        power_w: t.power_w,
                        ecc_errors: t.ecc_errors,
                        ecc_uncorrected: t.ecc_uncorrected,
                    }),
                })
                .collect(),
        }
    }
}

/// A value as JSON; these views always serialize.
fn to_json(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).expect("a view serializes to JSON")
}

/// A job view as JSON.
pub fn job(j: &pb::JobView) -> Value {
    to_json(&Job::from(j))
}

/// A job's preview video as JSON.
pub fn preview(p: &pb::PreviewView) -> Value {
    to_json(&Preview::from(p))
}

/// A worker view as JSON.
pub fn worker(w: &pb::WorkerView) -> Value {
    to_json(&Worker::from(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_lowercase_words() {
        let j = pb::JobView {
            id: 7,
            state: pb::JobState::Running as i32,
            tasks: vec![pb::TaskView {
                state: pb::TaskState::Leased as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = job(&j);
        assert_eq!(v["id"], 7);
        assert_eq!(v["state"], "running");
        assert_eq!(v["tasks"][0]["state"], "leased");
        assert_eq!(v["finished_ms"], Value::Null);
        assert_eq!(job_state(999), "unknown");
    }

    #[test]
    fn a_job_spec_reads_from_json_with_defaults_and_refuses_unknown_fields() {
        let s: pb::JobSpec = serde_json::from_str(
            r#"{"scene_digest": "ab", "frames": "1-3", "overscan": 4,
                "scene_info": {"width": 8, "height": 6}}"#,
        )
        .unwrap();
        assert_eq!(s.frames, "1-3");
        assert_eq!(s.overscan, Some(4));
        assert_eq!(s.scene_info.unwrap().file_format, "");
        assert_eq!(s.chunk, 0);
        let e = serde_json::from_str::<pb::JobSpec>(r#"{"frame": "1"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `frame`"), "{e}");
    }
}
