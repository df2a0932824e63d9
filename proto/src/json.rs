//! The JSON form of job and worker views: one conversion, used by
//! `tessera status --json` (and `jobs`, `workers`) and by the coordinator's
//! HTTP API, so that both print the same object. States are lowercase
//! strings (`"running"`), digests lowercase hex.

use serde_json::{json, Value};

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

/// A job view as JSON.
pub fn job(j: &pb::JobView) -> Value {
    json!({
        "id": j.id,
        "scene": j.scene_name,
        "scene_digest": j.scene_digest,
        "state": job_state(j.state),
        "frames": j.frames,
        "frames_total": j.frames_total,
        "frames_done": j.frames_done,
        "running_frames_done": j.running_frames_done,
        "outputs_total": j.outputs_total,
        "archived": j.archived,
        "chunk": j.chunk,
        "tiles": j.tiles,
        "overscan": j.overscan,
        "frame_tiles": j.frame_tiles.iter().map(|f| json!({"frame": f.frame, "tiles_done": f.tiles_done, "tiles_total": f.tiles_total, "stitched": f.stitched})).collect::<Vec<_>>(),
        "priority": j.priority,
        "max_attempts": j.max_attempts,
        "tasks_total": j.tasks_total,
        "tasks_done": j.tasks_done,
        "tasks_running": j.tasks_running,
        "tasks_failed": j.tasks_failed,
        "message": j.message,
        "waiting": j.waiting,
        "owner": j.owner,
        "file_set_digest": j.file_set_digest,
        "missing_files": j.missing_files,
        "device": j.device,
        "min_vram_gb": j.min_vram_gb,
        "tags": j.tags,
        "features": j.features,
        "blender": j.blender,
        "warnings": j.warnings,
        "outages": j.outages,
        "created_ms": j.created_ms,
        "finished_ms": if j.finished_ms == 0 { Value::Null } else { json!(j.finished_ms) },
        "after": j.after,
        "waiting_for": if j.waiting_for == 0 { Value::Null } else { json!(j.waiting_for) },
        "max_cost": j.max_cost,
        "capacity": j.capacity,
        "usage": j.usage.as_ref().map(|u| json!({
            "gpu_hours": u.gpu_hours,
            "cpu_hours": u.cpu_hours,
            "cost": u.cost,
            "failed_hours": u.failed_hours,
            "failed_cost": u.failed_cost,
            "preempted_hours": u.preempted_hours,
            "preempted_cost": u.preempted_cost,
        })),
        "outputs": j.outputs.iter().map(|o| json!({"frame": o.frame, "digest": o.digest, "ext": o.ext, "size": o.size, "pass": o.pass})).collect::<Vec<_>>(),
        "fps": if j.fps > 0.0 { json!(j.fps) } else { Value::Null },
        "preview": j.preview.as_ref().map(preview),
        "samples": samples(j),
        "samples_done": j.samples_done,
        "samples_total": j.samples_total,
        "tasks": j.tasks.iter().map(|t| json!({
            "index": t.index,
            "frames": t.frames,
            "tile": t.tile,
            "state": task_state(t.state),
            "attempts": t.attempts,
            "worker": t.worker_id,
            "frames_done": t.frames_done,
            "samples_done": t.samples_done,
            "samples_total": t.samples_total,
            "message": t.message,
            "attempt_log": t.attempt_log.iter().map(|a| json!({
                "worker": a.worker_id,
                "grant": a.grant,
                "seconds": a.seconds,
                "gpu": a.gpu,
                "price_per_hour": a.price_per_hour,
                "cost": a.cost,
                "end": a.end,
            })).collect::<Vec<_>>(),
            "verification": t.verification,
        })).collect::<Vec<_>>(),
        "verify": j.verify,
        "tasks_verifying": j.tasks_verifying,
        "frame_stats": j.frame_stats.iter().map(|s| json!({
            "frame": s.frame,
            "tile": s.tile,
            "render_ms": s.render_ms,
            "sync_ms": s.sync_ms,
            "samples": s.samples,
            "memory_peak_bytes": s.memory_peak_bytes,
        })).collect::<Vec<_>>(),
    })
}

/// A job's preview video as JSON.
pub fn preview(p: &pb::PreviewView) -> Value {
    json!({
        "state": p.state,
        "digest": p.digest,
        "size": p.size,
        "frames": p.frames,
        "width": p.width,
        "height": p.height,
        "fps": p.fps,
        "message": p.message,
    })
}

/// A worker view as JSON.
pub fn worker(w: &pb::WorkerView) -> Value {
    json!({
        "id": w.id,
        "name": w.name,
        "state": w.state,
        "slots": w.slots,
        "device": w.device,
        "blender": w.blender_version,
        "blender_features": w.blender_features,
        "runtimes": w.runtimes.iter().map(|r| json!({
            "version": r.version,
            "kind": r.kind,
            "path": r.path,
            "features": r.features,
            "devices": r.devices,
        })).collect::<Vec<_>>(),
        "tasks_in_hand": w.tasks_in_hand,
        "price_per_hour": w.price_per_hour,
        "capacity": w.capacity,
        "cpu_cores": w.cpu_cores,
        "tasks_running": w.tasks_running,
        "tasks_done": w.tasks_done,
        "tasks_failed": w.tasks_failed,
        "last_seen_ms": w.last_seen_ms,
        "memory_bytes": w.memory_bytes,
        "tags": w.tags,
        "drain_reason": w.drain_reason,
        "untrusted": w.untrusted,
        "suspect": w.suspect,
        "notes": w.notes,
        "slots_info": w.slot_info.iter().map(|s| json!({"slot": s.slot, "device": s.device, "gpu": s.gpu, "vram_bytes": s.vram_bytes})).collect::<Vec<_>>(),
        "gpus": w.gpus.iter().map(|g| json!({
            "index": g.index,
            "name": g.name,
            "vendor": g.vendor,
            "type": g.device_type,
            "memory_bytes": g.memory_bytes,
            "uuid": g.uuid,
            "telemetry": g.telemetry.map(|t| json!({
                "utilization_pct": t.utilization_pct,
                "memory_used_bytes": t.memory_used_bytes,
                "temperature_c": t.temperature_c,
                "power_w": t.power_w,
                "ecc_errors": t.ecc_errors,
                "ecc_uncorrected": t.ecc_uncorrected,
            })),
        })).collect::<Vec<_>>(),
    })
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
