//! Prometheus text exposition of the farm: queue depth by state, leases, task
//! durations, frames rendered, workers by state, and per-GPU utilisation,
//! memory, temperature, power and ECC errors.

use std::fmt::Write;

use crate::farm::{Farm, Latency, DURATION_BUCKETS, LATENCY_BUCKETS};
use crate::model::job::JobState;

/// Escapes a label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let parts: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", label(v)))
                .collect();
            let _ = write!(self.0, "{{{}}}", parts.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// A histogram family over [`LATENCY_BUCKETS`].
    fn latency(&mut self, name: &str, help: &str, h: &Latency) {
        self.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (bound, n) in LATENCY_BUCKETS.iter().zip(h.buckets) {
            cumulative += n;
            self.sample(&bucket, &[("le", &bound.to_string())], cumulative as f64);
        }
        let count = h.count() as f64;
        self.sample(&bucket, &[("le", "+Inf")], count);
        self.sample(&format!("{name}_sum"), &[], h.seconds);
        self.sample(&format!("{name}_count"), &[], count);
    }
}

/// `tessera_coordinator_role`: 1 for this coordinator's role (active or
/// standby, see [`crate::ha`]), 0 for the other.
pub fn role(active: bool) -> String {
    let mut o = Out(String::new());
    o.family(
        "tessera_coordinator_role",
        "gauge",
        "This coordinator's role: 1 for active or standby (high availability on PostgreSQL).",
    );
    o.sample(
        "tessera_coordinator_role",
        &[("role", "active")],
        f64::from(u8::from(active)),
    );
    o.sample(
        "tessera_coordinator_role",
        &[("role", "standby")],
        f64::from(u8::from(!active)),
    );
    o.0
}

/// The farm's metrics in Prometheus text format (version 0.0.4), as `who`
/// may see them: farm totals for everyone, per-job series only for the
/// jobs `who` may see (every job for an admin), so one user's job ids,
/// costs and hours do not reach another.
pub fn render(farm: &Farm, who: &crate::auth::Identity) -> String {
    let jobs = farm.job_summaries();
    let workers = farm.workers();
    let stats = farm.stats();
    let mut o = Out(String::new());

    o.family(
        "tessera_tasks",
        "gauge",
        "Tasks by state (queue depth is state=\"queued\").",
    );
    type Count = fn(&crate::farm::TaskCounts) -> u32;
    let by_state: [(&str, Count); 5] = [
        ("queued", |c| c.queued),
        ("leased", |c| c.leased),
        ("done", |c| c.done),
        ("failed", |c| c.failed),
        ("canceled", |c| c.canceled),
    ];
    for (state, count) in by_state {
        let n: u64 = jobs.iter().map(|j| u64::from(count(&j.counts))).sum();
        o.sample("tessera_tasks", &[("state", state)], n as f64);
    }
    o.family("tessera_jobs", "gauge", "Jobs by state.");
    for state in [
        JobState::Queued,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
        JobState::Canceled,
    ] {
        let n = jobs.iter().filter(|j| j.job.state == state).count();
        o.sample("tessera_jobs", &[("state", state.name())], n as f64);
    }
    o.family(
        "tessera_leases_active",
        "gauge",
        "Tasks leased to workers now.",
    );
    let leased: u64 = jobs.iter().map(|j| u64::from(j.counts.leased)).sum();
    o.sample("tessera_leases_active", &[], leased as f64);
    o.family(
        "tessera_leases_granted_total",
        "counter",
        "Leases granted since the coordinator started.",
    );
    o.sample(
        "tessera_leases_granted_total",
        &[],
        stats.leases_granted as f64,
    );
    o.family(
        "tessera_leases_expired_total",
        "counter",
        "Leases that expired (worker lost) since start.",
    );
    o.sample(
        "tessera_leases_expired_total",
        &[],
        stats.leases_expired as f64,
    );
    o.family(
        "tessera_store_commits_total",
        "counter",
        "Store transactions written since start (one flush and fsync each).",
    );
    o.sample("tessera_store_commits_total", &[], stats.commits as f64);
    o.latency(
        "tessera_store_commit_seconds",
        "Time one store transaction took to write and flush (the durable write every acknowledged change waits for).",
        &stats.commit_latency,
    );
    o.latency(
        "tessera_lease_seconds",
        "Time to serve a granted lease once a task was ready for the slot: the lock, the pick and the durable write of the lease (a parked call's idle wait for work is not counted).",
        &stats.lease_latency,
    );
    o.family(
        "tessera_store_changes_total",
        "counter",
        "Changes written since start; over commits, the mean group-commit size.",
    );
    o.sample(
        "tessera_store_changes_total",
        &[],
        stats.committed_changes as f64,
    );
    o.family(
        "tessera_task_failures_total",
        "counter",
        "Failed task attempts reported since start.",
    );
    o.sample(
        "tessera_task_failures_total",
        &[],
        stats.attempts_failed as f64,
    );
    verify_metrics(&mut o, &stats);

    o.family(
        "tessera_task_duration_seconds",
        "histogram",
        "Time from lease to result of completed tasks.",
    );
    let mut cumulative = 0;
    for (bound, n) in DURATION_BUCKETS.iter().zip(stats.duration_buckets) {
        cumulative += n;
        o.sample(
            "tessera_task_duration_seconds_bucket",
            &[("le", &bound.to_string())],
            cumulative as f64,
        );
    }
    o.sample(
        "tessera_task_duration_seconds_bucket",
        &[("le", "+Inf")],
        stats.duration_count as f64,
    );
    o.sample("tessera_task_duration_seconds_sum", &[], stats.duration_sum);
    o.sample(
        "tessera_task_duration_seconds_count",
        &[],
        stats.duration_count as f64,
    );

    o.family(
        "tessera_frames_rendered_total",
        "counter",
        "Frames rendered (stitched, for tiled jobs) and stored.",
    );
    let frames: u64 = jobs.iter().map(|j| u64::from(j.counts.frames_done)).sum();
    o.sample("tessera_frames_rendered_total", &[], frames as f64);

    o.family(
        "tessera_workers",
        "gauge",
        "Workers by state: idle and busy (holding a task) are online and take work; draining takes none.",
    );
    for state in ["idle", "busy", "draining", "offline"] {
        let n = workers
            .iter()
            .filter(|w| match state {
                "idle" => w.online && w.drain.is_none() && w.running == 0,
                "busy" => w.online && w.drain.is_none() && w.running > 0,
                "draining" => w.online && w.drain.is_some(),
                _ => !w.online,
            })
            .count();
        o.sample("tessera_workers", &[("state", state)], n as f64);
    }

    o.family(
        "tessera_slots",
        "gauge",
        "Render slots of online workers: idle, busy (rendering) or draining.",
    );
    let (mut idle, mut busy, mut draining) = (0u64, 0u64, 0u64);
    for w in workers.iter().filter(|w| w.online) {
        let slots = u64::from(w.record.slots);
        let running = u64::from(w.running).min(slots);
        if w.drain.is_some() {
            draining += slots;
        } else {
            busy += running;
            idle += slots - running;
        }
    }
    for (state, n) in [("idle", idle), ("busy", busy), ("draining", draining)] {
        o.sample("tessera_slots", &[("state", state)], n as f64);
    }
    o.family(
        "tessera_worker_busy_slots",
        "gauge",
        "Slots each online worker renders with now; tells a starved GPU from an idle one.",
    );
    for w in workers.iter().filter(|w| w.online) {
        o.sample(
            "tessera_worker_busy_slots",
            &[("worker", &w.record.id.0), ("name", &w.record.name)],
            f64::from(w.running),
        );
    }

    o.family(
        "tessera_desired_slots",
        "gauge",
        "Slots each requirement class needs to drain its queue within --target-drain-minutes (the autoscaling signal).",
    );
    for d in farm.desired_slots() {
        let vram = format!("{}", d.min_vram_gb);
        o.sample(
            "tessera_desired_slots",
            &[
                ("device", &d.device),
                ("min_vram_gb", &vram),
                ("tags", &d.tags),
            ],
            d.slots as f64,
        );
    }
    o.family(
        "tessera_preemptions_total",
        "counter",
        "Leases handed back by preempted workers (no attempt charged).",
    );
    o.sample("tessera_preemptions_total", &[], stats.preemptions as f64);

    type UsageValue = fn(&crate::model::usage::Usage) -> f64;
    let usage_series: [(&str, &str, UsageValue); 3] = [
        (
            "tessera_job_cost_total",
            "What each live job's attempts cost, failed and preempted ones included.",
            |u| u.cost,
        ),
        (
            "tessera_job_gpu_hours_total",
            "GPU slot-hours of each live job's attempts.",
            |u| u.gpu_ms as f64 / 3_600_000.0,
        ),
        (
            "tessera_job_cpu_hours_total",
            "CPU slot-hours of each live job's attempts.",
            |u| u.cpu_ms as f64 / 3_600_000.0,
        ),
    ];
    for (name, help, value) in usage_series {
        o.family(name, "counter", help);
        for j in jobs
            .iter()
            .filter(|j| who.sees_all_metrics() || who.may_see(&j.job.owner))
        {
            o.sample(name, &[("job", &j.job.id.to_string())], value(&j.usage));
        }
    }

    // Progress of running jobs: a count of done tasks that stays flat is a stuck job.
    type JobValue = fn(&crate::farm::TaskCounts) -> u32;
    let job_series: [(&str, &str, JobValue); 2] = [
        ("tessera_job_tasks", "Tasks of each running job.", |c| {
            c.queued + c.leased + c.done + c.failed + c.canceled
        }),
        (
            "tessera_job_tasks_done",
            "Tasks done of each running job.",
            |c| c.done,
        ),
    ];
    for (name, help, value) in job_series {
        o.family(name, "gauge", help);
        let running = jobs.iter().filter(|j| {
            j.job.state == JobState::Running
                && (who.sees_all_metrics() || who.may_see(&j.job.owner))
        });
        for j in running {
            o.sample(
                name,
                &[("job", &j.job.id.to_string())],
                f64::from(value(&j.counts)),
            );
        }
    }

    type GpuValue = fn(&crate::model::hardware::Gpu) -> Option<f64>;
    let gpu_series: [(&str, &str, &str, GpuValue); 7] = [
        (
            "tessera_gpu_utilization_ratio",
            "gauge",
            "GPU utilisation, 0 to 1.",
            |g| g.telemetry.map(|t| f64::from(t.utilization_pct) / 100.0),
        ),
        (
            "tessera_gpu_memory_used_bytes",
            "gauge",
            "GPU memory in use.",
            |g| g.telemetry.map(|t| t.memory_used_bytes as f64),
        ),
        (
            "tessera_gpu_memory_total_bytes",
            "gauge",
            "GPU device-local memory.",
            |g| Some(g.memory_bytes as f64),
        ),
        (
            "tessera_gpu_temperature_celsius",
            "gauge",
            "GPU temperature.",
            |g| g.telemetry.map(|t| f64::from(t.temperature_c)),
        ),
        ("tessera_gpu_power_watts", "gauge", "GPU power draw.", |g| {
            g.telemetry.map(|t| t.power_w)
        }),
        (
            "tessera_gpu_ecc_errors",
            "gauge",
            "Volatile ECC errors since the driver loaded.",
            |g| g.telemetry.map(|t| t.ecc_errors as f64),
        ),
        (
            "tessera_gpu_ecc_uncorrected_errors",
            "gauge",
            "Uncorrected volatile ECC errors since the driver loaded (any is corrupted data).",
            |g| g.telemetry.map(|t| t.ecc_uncorrected as f64),
        ),
    ];
    for (name, kind, help, value) in gpu_series {
        o.family(name, kind, help);
        for w in &workers {
            for g in &w.record.gpus {
                if let Some(v) = value(g) {
                    let index = g.index.to_string();
                    o.sample(
                        name,
                        &[
                            ("worker", &w.record.id.0),
                            ("gpu", &index),
                            ("name", &g.name),
                        ],
                        v,
                    );
                }
            }
        }
    }
    // Only an active coordinator has a farm to render.
    let store = farm.store_health().map(|h| h.metrics()).unwrap_or_default();
    let blobs = farm.blobs_health().map(|h| h.metrics()).unwrap_or_default();
    o.0 + &role(true) + &store + &blobs
}

/// Frame verification: results compared, and tasks whose results differed.
fn verify_metrics(o: &mut Out, stats: &crate::farm::Stats) {
    o.family(
        "tessera_verify_checks_total",
        "counter",
        "Verification renders compared with an earlier result of their task since start.",
    );
    o.sample(
        "tessera_verify_checks_total",
        &[],
        stats.verify_checks as f64,
    );
    o.family(
        "tessera_verify_mismatches_total",
        "counter",
        "Tasks whose results differed between workers since start (once a task).",
    );
    o.sample(
        "tessera_verify_mismatches_total",
        &[],
        stats.verify_mismatches as f64,
    );
}
