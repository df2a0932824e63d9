//! Prometheus text exposition of the farm: queue depth by state, leases, task
//! durations, frames rendered, workers by state, and per-GPU utilisation,
//! memory, temperature, power and ECC errors.
//!
//! Each scrape gathers the farm's figures into [`Families`], which
//! `prometheus-client` writes in the Prometheus text format (version 0.0.4):
//! escaping, number formatting, a histogram's cumulative buckets and a
//! counter's `_total` suffix are the crate's.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::farm::{Farm, Latency, DURATION_BUCKETS, LATENCY_BUCKETS};
use crate::health::StoreHealth;
use crate::model::job::JobState;

/// The `Content-Type` of what [`render`] and [`standby`] return.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// One sample's value.
#[derive(Debug)]
enum Value {
    /// A whole number: counts, bytes, a 0/1 flag.
    Whole(u64),
    /// A real number: ratios, costs, hours, watts.
    Real(f64),
    /// A histogram: per-bucket counts (not cumulative, the last one `+Inf`),
    /// the sum and the count of the observations.
    Histogram {
        buckets: Vec<(f64, u64)>,
        sum: f64,
        count: u64,
    },
}

/// A metric family: its full name (a counter's with `_total`, as scraped),
/// type, help and samples.
#[derive(Debug)]
struct Family {
    name: &'static str,
    kind: MetricType,
    help: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, Value)>,
}

/// The families of one scrape, in the order they are written.
#[derive(Debug, Default)]
struct Families(Vec<Family>);

impl Families {
    fn family(&mut self, name: &'static str, kind: MetricType, help: &'static str) {
        self.0.push(Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        });
    }

    /// A sample of the family declared last.
    fn sample(&mut self, labels: &[(&'static str, &str)], value: Value) {
        let family = self.0.last_mut().expect("a sample follows its family");
        let labels = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
        family.samples.push((labels, value));
    }

    /// A histogram family over [`LATENCY_BUCKETS`].
    fn latency(&mut self, name: &'static str, help: &'static str, h: &Latency) {
        self.family(name, MetricType::Histogram, help);
        let mut buckets: Vec<(f64, u64)> = LATENCY_BUCKETS.iter().copied().zip(h.buckets).collect();
        buckets.push((f64::INFINITY, h.slowest));
        let value = Value::Histogram {
            buckets,
            sum: h.seconds,
            count: h.count(),
        };
        self.sample(&[], value);
    }

    /// The families in Prometheus text format.
    fn text(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        prometheus_text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            // The encoder appends `_total` to a counter's name itself.
            let name = match f.kind {
                MetricType::Counter => f.name.strip_suffix("_total").unwrap_or(f.name),
                _ => f.name,
            };
            let mut metric = encoder.encode_descriptor(name, f.help, None, f.kind)?;
            for (labels, value) in &f.samples {
                let mut m = metric.encode_family(labels)?;
                match (value, f.kind) {
                    (Value::Whole(v), MetricType::Counter) => {
                        m.encode_counter::<NoLabelSet, _, f64>(v, None)?
                    }
                    (Value::Real(v), MetricType::Counter) => {
                        m.encode_counter::<NoLabelSet, _, f64>(v, None)?
                    }
                    (Value::Whole(v), _) => m.encode_gauge(v)?,
                    (Value::Real(v), _) => m.encode_gauge(v)?,
                    (
                        Value::Histogram {
                            buckets,
                            sum,
                            count,
                        },
                        _,
                    ) => m.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?,
                }
            }
        }
        Ok(())
    }
}

/// `tessera_coordinator_role`: 1 for this coordinator's role (active or
/// standby, see [`crate::ha`]), 0 for the other.
fn role(o: &mut Families, active: bool) {
    o.family(
        "tessera_coordinator_role",
        MetricType::Gauge,
        "This coordinator's role: 1 for active or standby (high availability on PostgreSQL).",
    );
    o.sample(&[("role", "active")], Value::Whole(u64::from(active)));
    o.sample(&[("role", "standby")], Value::Whole(u64::from(!active)));
}

/// `tessera_store_up` or `tessera_blobs_up`: whether a remote store answered.
fn health(o: &mut Families, h: &StoreHealth) {
    let (name, help) = h.gauge();
    o.family(name, MetricType::Gauge, help);
    o.sample(&[], Value::Whole(u64::from(h.up())));
}

/// A standby's metrics: its role and whether the metadata store answers.
pub fn standby(store: &StoreHealth) -> String {
    let mut o = Families::default();
    role(&mut o, false);
    health(&mut o, store);
    o.text()
}

/// A store's health gauge alone, in Prometheus text format.
#[cfg(test)]
pub(crate) fn store_health(h: &StoreHealth) -> String {
    let mut o = Families::default();
    health(&mut o, h);
    o.text()
}

/// The farm's metrics in Prometheus text format (version 0.0.4), as `who`
/// may see them: farm totals for everyone, per-job series only for the
/// jobs `who` may see (every job for an admin), so one user's job ids,
/// costs and hours do not reach another.
pub fn render(farm: &Farm, who: &crate::auth::Identity) -> String {
    use MetricType::{Counter, Gauge, Histogram};
    use Value::{Real, Whole};
    let jobs = farm.job_summaries();
    let workers = farm.workers();
    let stats = farm.stats();
    let mut o = Families::default();

    o.family(
        "tessera_tasks",
        Gauge,
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
        o.sample(&[("state", state)], Whole(n));
    }
    o.family("tessera_jobs", Gauge, "Jobs by state.");
    for state in [
        JobState::Queued,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
        JobState::Canceled,
    ] {
        let n = jobs.iter().filter(|j| j.job.state == state).count();
        o.sample(&[("state", state.name())], Whole(n as u64));
    }
    o.family(
        "tessera_leases_active",
        Gauge,
        "Tasks leased to workers now.",
    );
    let leased: u64 = jobs.iter().map(|j| u64::from(j.counts.leased)).sum();
    o.sample(&[], Whole(leased));
    o.family(
        "tessera_leases_granted_total",
        Counter,
        "Leases granted since the coordinator started.",
    );
    o.sample(&[], Whole(stats.leases_granted));
    o.family(
        "tessera_leases_with_results_total",
        Counter,
        "Of the leases granted, those asked for with a result (in a Complete's answer) instead of by a Lease call.",
    );
    o.sample(&[], Whole(stats.leases_with_results));
    o.family(
        "tessera_leases_expired_total",
        Counter,
        "Leases that expired (worker lost) since start.",
    );
    o.sample(&[], Whole(stats.leases_expired));
    o.family(
        "tessera_renewal_calls_total",
        Counter,
        "Lease-renewal calls since start: renew renews all of a worker's leases in one call; progress renews one (workers that predate renew).",
    );
    o.sample(&[("call", "renew")], Whole(stats.renew_calls));
    o.sample(&[("call", "progress")], Whole(stats.progress_calls));
    o.family(
        "tessera_leases_renewed_total",
        Counter,
        "Lease renewals workers asked for since start, by either call.",
    );
    o.sample(&[], Whole(stats.leases_renewed));
    o.family(
        "tessera_store_commits_total",
        Counter,
        "Store transactions written since start (one flush and fsync each).",
    );
    o.sample(&[], Whole(stats.commits));
    o.latency(
        "tessera_store_commit_seconds",
        "Time one store transaction took to write and flush (the durable write every acknowledged change waits for).",
        &stats.commit_latency,
    );
    o.latency(
        "tessera_result_sync_seconds",
        "Time one group of results took to store its carried files and sync every waiting blob (a blob directory only): what a Complete waits for before its change is committed. Its count is the number of groups.",
        &stats.result_sync_latency,
    );
    o.family(
        "tessera_result_sync_results_total",
        Counter,
        "Results those groups held; over tessera_result_sync_seconds_count, the mean group.",
    );
    o.sample(&[], Whole(stats.result_sync_results));
    o.latency(
        "tessera_lease_seconds",
        "Time to serve a granted lease once a task was ready for the slot: the lock, the pick and the durable write of the lease (a parked call's idle wait for work is not counted).",
        &stats.lease_latency,
    );
    o.family(
        "tessera_store_changes_total",
        Counter,
        "Changes written since start; over commits, the mean group-commit size.",
    );
    o.sample(&[], Whole(stats.committed_changes));
    o.family(
        "tessera_task_failures_total",
        Counter,
        "Failed task attempts reported since start.",
    );
    o.sample(&[], Whole(stats.attempts_failed));
    verify_metrics(&mut o, &stats);

    o.family(
        "tessera_task_duration_seconds",
        Histogram,
        "Time from lease to result of completed tasks.",
    );
    let mut buckets: Vec<(f64, u64)> = DURATION_BUCKETS
        .iter()
        .copied()
        .zip(stats.duration_buckets)
        .collect();
    let bucketed: u64 = stats.duration_buckets.iter().sum();
    buckets.push((f64::INFINITY, stats.duration_count.saturating_sub(bucketed)));
    o.sample(
        &[],
        Value::Histogram {
            buckets,
            sum: stats.duration_sum,
            count: stats.duration_count,
        },
    );

    o.family(
        "tessera_frames_rendered_total",
        Counter,
        "Frames rendered (stitched, for tiled jobs) and stored.",
    );
    let frames: u64 = jobs.iter().map(|j| u64::from(j.counts.frames_done)).sum();
    o.sample(&[], Whole(frames));

    o.family(
        "tessera_workers",
        Gauge,
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
        o.sample(&[("state", state)], Whole(n as u64));
    }

    o.family(
        "tessera_slots",
        Gauge,
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
        o.sample(&[("state", state)], Whole(n));
    }
    o.family(
        "tessera_worker_busy_slots",
        Gauge,
        "Slots each online worker renders with now; tells a starved GPU from an idle one.",
    );
    for w in workers.iter().filter(|w| w.online) {
        o.sample(
            &[("worker", &w.record.id.0), ("name", &w.record.name)],
            Whole(u64::from(w.running)),
        );
    }

    o.family(
        "tessera_desired_slots",
        Gauge,
        "Slots each requirement class needs to drain its queue within --target-drain-minutes (the autoscaling signal).",
    );
    for d in farm.desired_slots() {
        let vram = format!("{}", d.min_vram_gb);
        o.sample(
            &[
                ("device", &d.device),
                ("min_vram_gb", &vram),
                ("tags", &d.tags),
            ],
            Whole(d.slots),
        );
    }
    o.family(
        "tessera_preemptions_total",
        Counter,
        "Leases handed back by preempted workers (no attempt charged).",
    );
    o.sample(&[], Whole(stats.preemptions));

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
        o.family(name, Counter, help);
        for j in jobs
            .iter()
            .filter(|j| who.sees_all_metrics() || who.may_see(&j.job.owner))
        {
            o.sample(&[("job", &j.job.id.to_string())], Real(value(&j.usage)));
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
        o.family(name, Gauge, help);
        let running = jobs.iter().filter(|j| {
            j.job.state == JobState::Running
                && (who.sees_all_metrics() || who.may_see(&j.job.owner))
        });
        for j in running {
            o.sample(
                &[("job", &j.job.id.to_string())],
                Whole(u64::from(value(&j.counts))),
            );
        }
    }

    type GpuValue = fn(&crate::model::hardware::Gpu) -> Option<Value>;
    let gpu_series: [(&str, &str, GpuValue); 7] = [
        (
            "tessera_gpu_utilization_ratio",
            "GPU utilisation, 0 to 1.",
            |g| {
                g.telemetry
                    .map(|t| Real(f64::from(t.utilization_pct) / 100.0))
            },
        ),
        ("tessera_gpu_memory_used_bytes", "GPU memory in use.", |g| {
            g.telemetry.map(|t| Whole(t.memory_used_bytes))
        }),
        (
            "tessera_gpu_memory_total_bytes",
            "GPU device-local memory.",
            |g| Some(Whole(g.memory_bytes)),
        ),
        ("tessera_gpu_temperature_celsius", "GPU temperature.", |g| {
            g.telemetry.map(|t| Whole(u64::from(t.temperature_c)))
        }),
        ("tessera_gpu_power_watts", "GPU power draw.", |g| {
            g.telemetry.map(|t| Real(t.power_w))
        }),
        (
            "tessera_gpu_ecc_errors",
            "Volatile ECC errors since the driver loaded.",
            |g| g.telemetry.map(|t| Whole(t.ecc_errors)),
        ),
        (
            "tessera_gpu_ecc_uncorrected_errors",
            "Uncorrected volatile ECC errors since the driver loaded (any is corrupted data).",
            |g| g.telemetry.map(|t| Whole(t.ecc_uncorrected)),
        ),
    ];
    for (name, help, value) in gpu_series {
        o.family(name, Gauge, help);
        for w in &workers {
            for g in &w.record.gpus {
                if let Some(v) = value(g) {
                    let index = g.index.to_string();
                    o.sample(
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
    role(&mut o, true);
    if let Some(h) = farm.store_health() {
        health(&mut o, &h);
    }
    if let Some(h) = farm.blobs_health() {
        health(&mut o, &h);
    }
    o.text()
}

/// Frame verification: results compared, and tasks whose results differed.
fn verify_metrics(o: &mut Families, stats: &crate::farm::Stats) {
    o.family(
        "tessera_verify_checks_total",
        MetricType::Counter,
        "Verification renders compared with an earlier result of their task since start.",
    );
    o.sample(&[], Value::Whole(stats.verify_checks));
    o.family(
        "tessera_verify_mismatches_total",
        MetricType::Counter,
        "Tasks whose results differed between workers since start (once a task).",
    );
    o.sample(&[], Value::Whole(stats.verify_mismatches));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_keep_prometheus_names_buckets_and_escapes() {
        let mut o = Families::default();
        o.family("tessera_x_total", MetricType::Counter, "Xs since start.");
        o.sample(&[], Value::Whole(7));
        o.family("tessera_g", MetricType::Gauge, "A gauge.");
        o.sample(&[("name", "a \"b\"\\c\nd")], Value::Real(0.87));
        let mut h = Latency::default();
        h.observe(0.0005);
        h.observe(0.7);
        h.observe(9.0);
        o.latency("tessera_h_seconds", "A histogram.", &h);
        let text = o.text();
        let expected = [
            "# HELP tessera_x_total Xs since start.",
            "# TYPE tessera_x_total counter",
            "tessera_x_total 7",
            "# TYPE tessera_g gauge",
            r#"tessera_g{name="a \"b\"\\c\nd"} 0.87"#,
            "# TYPE tessera_h_seconds histogram",
            r#"tessera_h_seconds_bucket{le="0.001"} 1"#,
            r#"tessera_h_seconds_bucket{le="0.5"} 1"#,
            r#"tessera_h_seconds_bucket{le="1"} 2"#,
            r#"tessera_h_seconds_bucket{le="2.5"} 2"#,
            r#"tessera_h_seconds_bucket{le="+Inf"} 3"#,
            "tessera_h_seconds_count 3",
        ];
        for line in expected {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
        assert!(
            !text.contains("_total_total") && !text.contains("# EOF"),
            "{text}"
        );
        assert_eq!(text.matches(r#"le="+Inf""#).count(), 1, "{text}");
    }

    #[test]
    fn a_standby_says_its_role_and_its_store() {
        let text = standby(&StoreHealth::new("PostgreSQL at db:5432/tessera"));
        assert!(
            text.contains("tessera_coordinator_role{role=\"active\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("tessera_coordinator_role{role=\"standby\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("\ntessera_store_up 1\n"), "{text}");
    }
}
