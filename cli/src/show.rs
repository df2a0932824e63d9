//! Human tables and JSON for jobs, workers and a scene's files, with what
//! verification adds (render statistics, untrusted and suspect workers).
//! Prints what it is given; calls no coordinator.

use serde_json::{json, Value};
use tessera_proto as pb;

use tessera_proto::json::{job_state, task_state};

use crate::client::frame_count;
use crate::fileset::Layout;

fn age(ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let s = now.saturating_sub(ms) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        _ => format!("{}h ago", s / 3600),
    }
}

/// Prints rows as aligned columns.
pub(crate) fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r);
    }
}

/// The jobs table.
pub fn jobs(jobs: &[pb::JobView]) {
    if jobs.is_empty() {
        println!("no jobs; submit one with `tessera submit SCENE.blend`");
        return;
    }
    let rows = jobs
        .iter()
        .map(|j| {
            vec![
                j.id.to_string(),
                if j.archived {
                    format!("{} (archived)", job_state(j.state))
                } else if j.waiting_for != 0 {
                    format!("waiting for {}", j.waiting_for)
                } else {
                    job_state(j.state)
                },
                format!("{}/{}", frame_count(j), j.frames_total),
                j.frames.clone(),
                j.priority.to_string(),
                j.scene_name.clone(),
                j.usage
                    .as_ref()
                    .map_or(String::new(), |u| format!("{:.2}", u.cost)),
                age(j.created_ms),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATE",
            "DONE",
            "FRAMES",
            "PRIO",
            "SCENE",
            "COST",
            "SUBMITTED",
        ],
        rows,
    );
}

/// One job in detail.
pub fn job(j: &pb::JobView) {
    println!("job {}  {}", j.id, job_state(j.state));
    println!(
        "  scene     {} ({})",
        j.scene_name,
        &j.scene_digest[..j.scene_digest.len().min(16)]
    );
    println!(
        "  frames    {}  ({} done of {})",
        j.frames,
        frame_count(j),
        j.frames_total
    );
    println!(
        "  tasks     {} done, {} running, {} failed, {} total  (chunk {})",
        j.tasks_done,
        j.tasks_running,
        j.tasks_failed,
        j.tasks_total,
        match j.chunk {
            0 => "sized by the farm".to_string(),
            n => n.to_string(),
        }
    );
    println!(
        "  priority  {}   max attempts {}",
        j.priority, j.max_attempts
    );
    println!("  submitted {}", age(j.created_ms));
    if !j.file_set_digest.is_empty() {
        println!(
            "  files     file set {}",
            &j.file_set_digest[..j.file_set_digest.len().min(16)]
        );
    }
    for w in &j.warnings {
        println!("  warning   {w}");
    }
    if !j.missing_files.is_empty() {
        println!(
            "  missing   {} file(s) submitted without (--allow-missing):",
            j.missing_files.len()
        );
        for m in &j.missing_files {
            println!("            {m}");
        }
    }
    if j.device != "any" || j.min_vram_gb > 0.0 || !j.tags.is_empty() {
        println!(
            "  needs     device {}, {} GB GPU memory, tags [{}]",
            j.device,
            j.min_vram_gb,
            j.tags.join(", ")
        );
    }
    if !j.blender.is_empty() || !j.features.is_empty() {
        println!(
            "  blender   {}{}",
            if j.blender.is_empty() {
                "any"
            } else {
                &j.blender
            },
            if j.features.is_empty() {
                String::new()
            } else {
                format!(" with {}", j.features.join(", "))
            }
        );
    }
    if !j.after.is_empty() {
        let deps: Vec<String> = j.after.iter().map(u64::to_string).collect();
        println!(
            "  after     job(s) {} (starts when they are done)",
            deps.join(", ")
        );
    }
    if let Some(u) = &j.usage {
        println!(
            "  cost      {:.4} ({:.4} GPU-hours, {:.4} CPU-hours){}",
            u.cost,
            u.gpu_hours,
            u.cpu_hours,
            j.max_cost
                .map_or(String::new(), |m| format!("; budget {m:.2}"))
        );
        if u.failed_cost > 0.0 || u.failed_hours > 0.0 {
            println!(
                "            of which failed attempts {:.4} ({:.4} h)",
                u.failed_cost, u.failed_hours
            );
        }
        if u.preempted_cost > 0.0 || u.preempted_hours > 0.0 {
            println!(
                "            of which preempted attempts {:.4} ({:.4} h)",
                u.preempted_cost, u.preempted_hours
            );
        }
    }
    if j.capacity == "on-demand-only" {
        println!("  capacity  on-demand and reserved workers only");
    }
    if !j.waiting.is_empty() {
        println!("  {}", j.waiting);
    }
    for line in &j.outages {
        println!("  down      {line}");
    }
    if !j.message.is_empty() {
        println!("  message   {}", j.message.replace('\n', "\n            "));
    }
    if let Some(line) = crate::preview::status_line(j) {
        println!("  preview   {line}");
    }
    if !j.frame_tiles.is_empty() {
        println!(
            "  tiles     {} per frame, {} px overscan",
            j.tiles, j.overscan
        );
        println!();
        let rows = j
            .frame_tiles
            .iter()
            .map(|f| {
                vec![
                    f.frame.to_string(),
                    format!("{}/{}", f.tiles_done, f.tiles_total),
                    if f.stitched {
                        "stitched"
                    } else if f.tiles_done == f.tiles_total {
                        "stitching"
                    } else {
                        "rendering"
                    }
                    .to_string(),
                ]
            })
            .collect();
        table(&["FRAME", "TILES", "STATE"], rows);
    }
    println!();
    let rows = j
        .tasks
        .iter()
        .map(|t| {
            let frames = match t.frames.as_slice() {
                [one] => one.to_string(),
                [first, .., last] => format!("{first}-{last}"),
                [] => String::new(),
            };
            let first_line = t
                .message
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(80)
                .collect::<String>();
            let progress = if t.state == pb::TaskState::Leased as i32 && t.samples_total > 0 {
                format!("{}/{} samples", t.samples_done, t.samples_total)
            } else {
                t.verification.clone()
            };
            vec![
                t.index.to_string(),
                frames,
                task_state(t.state),
                t.worker_id.clone(),
                progress,
                t.attempts.to_string(),
                slot_time(t),
                first_line,
            ]
        })
        .collect();
    table(
        &[
            "TASK",
            "FRAMES",
            "STATE",
            "WORKER",
            "PROGRESS",
            "FAILURES",
            "SLOT TIME, COST",
            "LAST ERROR",
        ],
        rows,
    );
    if (j.tasks.len() as u32) < j.tasks_total {
        println!("  (the first {} of {} tasks)", j.tasks.len(), j.tasks_total);
    }
    verification(j);
}

/// A worker's Blenders: `4.5.15 bpy (openimagedenoise, eevee) · 3.4.1`.
fn blenders(w: &pb::WorkerView) -> String {
    if w.runtimes.is_empty() {
        return w.blender_version.clone();
    }
    w.runtimes
        .iter()
        .map(|r| {
            let mut what = r.features.clone();
            what.extend(r.devices.iter().cloned());
            let kind = if r.kind == "bpy" { " bpy" } else { "" };
            if what.is_empty() {
                format!("{}{kind}", r.version)
            } else {
                format!("{}{kind} ({})", r.version, what.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The workers table.
pub fn workers(workers: &[pb::WorkerView]) {
    if workers.is_empty() {
        println!("no workers; start one with `tessera worker --coordinator URL`");
        return;
    }
    let rows = workers
        .iter()
        .map(|w| {
            vec![
                w.id.clone(),
                w.name.clone(),
                worker_state(w),
                format!("{}/{}", w.tasks_running, w.slots),
                if w.price_per_hour > 0.0 {
                    format!("{} {:.2}/h", w.capacity, w.price_per_hour)
                } else {
                    w.capacity.clone()
                },
                w.tasks_done.to_string(),
                w.tasks_failed.to_string(),
                w.device.clone(),
                w.tags.join(","),
                blenders(w),
                age(w.last_seen_ms),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "NAME",
            "STATE",
            "BUSY",
            "CAPACITY",
            "DONE",
            "FAILED",
            "DEVICE",
            "TAGS",
            "BLENDER",
            "LAST SEEN",
        ],
        rows,
    );
    let gpus: Vec<Vec<String>> = workers
        .iter()
        .flat_map(|w| {
            w.gpus.iter().map(move |g| {
                let t = g.telemetry;
                vec![
                    w.id.clone(),
                    g.index.to_string(),
                    g.name.clone(),
                    format!("{:.1} GiB", g.memory_bytes as f64 / (1u64 << 30) as f64),
                    t.map_or("-".into(), |t| {
                        format!(
                            "{:.1} GiB",
                            t.memory_used_bytes as f64 / (1u64 << 30) as f64
                        )
                    }),
                    t.map_or("-".into(), |t| format!("{}%", t.utilization_pct)),
                    t.map_or("-".into(), |t| format!("{} °C", t.temperature_c)),
                    t.map_or("-".into(), |t| t.ecc_errors.to_string()),
                ]
            })
        })
        .collect();
    if !gpus.is_empty() {
        println!();
        table(
            &[
                "WORKER", "GPU", "NAME", "MEMORY", "USED", "UTIL", "TEMP", "ECC",
            ],
            gpus,
        );
    }
    for w in workers.iter().filter(|w| !w.drain_reason.is_empty()) {
        println!("{} is draining: {}", w.id, w.drain_reason);
    }
    suspects(workers);
}

// What `status` and `workers` show of verifiable frames: per-frame render
// statistics (moved out of the images by the workers), verification, and
// untrusted or suspect workers.

/// Seconds with two decimals, from ms (`-` when Blender said nothing).
fn secs(ms: u64) -> String {
    if ms == 0 {
        "-".into()
    } else {
        format!("{:.2} s", ms as f64 / 1000.0)
    }
}

/// MiB with one decimal (`-` when Blender said nothing).
fn mib(bytes: u64) -> String {
    if bytes == 0 {
        "-".into()
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// The job's verification and its frames' render statistics.
fn verification(j: &pb::JobView) {
    if j.verify > 0.0 || j.tasks_verifying > 0 {
        println!(
            "  verify    {:.0} % of tasks rendered twice on different workers; {} awaiting a second result",
            j.verify * 100.0,
            j.tasks_verifying
        );
    }
    if j.frame_stats.is_empty() {
        return;
    }
    println!();
    let rows = j
        .frame_stats
        .iter()
        .map(|s| {
            vec![
                match s.tile {
                    Some(t) => format!("{} tile {t}", s.frame),
                    None => s.frame.to_string(),
                },
                secs(s.render_ms),
                secs(s.sync_ms),
                if s.samples == 0 {
                    "-".into()
                } else {
                    s.samples.to_string()
                },
                mib(s.memory_peak_bytes),
            ]
        })
        .collect();
    table(&["FRAME", "RENDER", "SYNC", "SAMPLES", "PEAK MEMORY"], rows);
}

/// A worker's state, with `untrusted` and `suspect` when they apply.
fn worker_state(w: &pb::WorkerView) -> String {
    let mut s = w.state.clone();
    if w.untrusted {
        s += ", untrusted";
    }
    if !w.suspect.is_empty() {
        s += ", suspect";
    }
    s
}

/// Why each suspect worker is.
fn suspects(workers: &[pb::WorkerView]) {
    for w in workers.iter().filter(|w| !w.suspect.is_empty()) {
        println!("{} is suspect: {}", w.id, w.suspect);
    }
}

/// `tessera deps`: each file under the job root, its size, and whether the
/// coordinator has it (`lacking` is None when it could not be asked).
pub fn deps(
    layout: &Layout,
    entries: &[pb::FileEntry],
    lacking: Option<&std::collections::HashSet<String>>,
    as_json: bool,
) -> anyhow::Result<()> {
    let on_farm = |d: &str| lacking.map(|l| !l.contains(d));
    if as_json {
        let files: Vec<Value> = layout
            .files
            .iter()
            .zip(entries)
            .map(|((rel, local), e)| {
                json!({"path": rel, "local": local, "size": e.size, "digest": e.digest,
                       "found": true, "on_coordinator": on_farm(&e.digest)})
            })
            .chain(
                layout
                    .missing
                    .iter()
                    .map(|m| json!({"path": m, "found": false, "on_coordinator": Value::Null})),
            )
            .collect();
        let mappings: Vec<Value> = layout
            .mappings
            .iter()
            .map(|(from, to)| json!({"from": from, "to": to}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "root": layout.root, "scene": layout.scene, "files": files,
                "mappings": mappings, "missing": layout.missing,
            }))?
        );
        return Ok(());
    }
    println!(
        "job root: {} (scene {})",
        layout.root.display(),
        layout.scene
    );
    let rows = layout
        .files
        .iter()
        .zip(entries)
        .map(|((rel, _), e)| {
            vec![
                rel.clone(),
                e.size.to_string(),
                "found".into(),
                match on_farm(&e.digest) {
                    Some(true) => "yes".into(),
                    Some(false) => "no".into(),
                    None => "unknown".into(),
                },
            ]
        })
        .chain(
            layout
                .missing
                .iter()
                .map(|m| vec![m.clone(), "-".into(), "MISSING".into(), "-".into()]),
        )
        .collect();
    table(&["PATH", "BYTES", "LOCAL", "ON COORDINATOR"], rows);
    for (from, to) in &layout.mappings {
        println!("maps {from} -> {to}");
    }
    Ok(())
}

/// Frame numbers in compact form: `1-5,9,12-13`.
pub fn compact_frames(frames: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < frames.len() {
        let start = frames[i];
        let mut end = start;
        while i + 1 < frames.len() && frames[i + 1] == end + 1 {
            i += 1;
            end = frames[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// A task's slot-time and cost over its ended attempts.
fn slot_time(t: &pb::TaskView) -> String {
    if t.attempt_log.is_empty() {
        return String::new();
    }
    let secs: f64 = t.attempt_log.iter().map(|a| a.seconds).sum();
    let cost: f64 = t.attempt_log.iter().map(|a| a.cost).sum();
    format!("{secs:.1}s {cost:.4}")
}
