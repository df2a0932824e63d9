//! A run's figures: one table row, or one JSON line; and the table that puts
//! two designs' runs side by side with their ratios.

use serde::{Deserialize, Serialize};

/// The figures of one measured run. Latencies are in milliseconds; a figure
/// is absent when the run did not get far enough to measure it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    /// Which coordinator ran ("new", "baseline", ...).
    pub design: String,
    /// Fake workers.
    pub workers: u32,
    /// Slots per worker.
    pub slots: u32,
    /// Tasks in the job.
    pub tasks: u32,
    /// Fake render time per task.
    pub render_ms: u64,
    /// Spread of the render times, a fraction of `render_ms`.
    #[serde(default)]
    pub render_jitter: f64,
    /// Whether slots leased their next task while rendering, as workers do
    /// (`false`: `--no-lease-ahead`, or a run from before the option).
    #[serde(default)]
    pub lease_ahead: bool,
    /// `ok`, `timeout: STEP` or `error: MESSAGE`.
    pub outcome: String,
    /// Seconds the `SubmitJob` of the whole job took.
    pub submit_s: Option<f64>,
    /// Seconds registering every worker took.
    pub register_s: Option<f64>,
    /// Length of the measured window in seconds.
    pub window_s: Option<f64>,
    /// Completions acknowledged within the window.
    pub completions: Option<u64>,
    /// Acknowledged completions per second over the window.
    pub completions_per_s: Option<f64>,
    /// Lease calls that returned a task, within the window.
    pub leases: Option<u64>,
    /// Lease calls whose long-poll wait ended without a task (not timed).
    pub empty_leases: Option<u64>,
    /// Lease latency (calls that returned a task).
    pub lease_p50_ms: Option<f64>,
    /// Lease latency (calls that returned a task).
    pub lease_p99_ms: Option<f64>,
    /// Leases granted in a Complete's answer (whole run), not by a Lease
    /// call: those are not in the Lease latencies; `idle_*` has them.
    pub carried_leases: Option<u64>,
    /// A slot's idle time between renders: from one render's end to its
    /// next task in hand (the result reported and the next lease granted,
    /// whichever call brought it).
    pub idle_p50_ms: Option<f64>,
    /// A slot's idle time between renders.
    pub idle_p99_ms: Option<f64>,
    /// Complete latency (acknowledged calls).
    pub complete_p50_ms: Option<f64>,
    /// Complete latency (acknowledged calls).
    pub complete_p99_ms: Option<f64>,
    /// A result from the render's end to its Complete acknowledged, the
    /// upload included (comparable across inline results and PutBlob).
    pub result_p50_ms: Option<f64>,
    /// A result from the render's end to its Complete acknowledged.
    pub result_p99_ms: Option<f64>,
    /// Result upload latency (none when every result went inline).
    pub put_blob_p99_ms: Option<f64>,
    /// Results sent inside their Complete call (whole run), not uploaded.
    pub inline_results: Option<u64>,
    /// Progress latency.
    pub progress_p99_ms: Option<f64>,
    /// `GetJob` with the first 1,000 tasks (`tessera status`).
    pub status_p50_ms: Option<f64>,
    /// `GetJob` with the first 1,000 tasks (`tessera status`).
    pub status_p99_ms: Option<f64>,
    /// `GetJob` calls answered within the window.
    pub status_calls: Option<u64>,
    /// `ListJobs` (`tessera jobs`).
    pub jobs_p99_ms: Option<f64>,
    /// `/metrics` scrapes.
    pub metrics_p99_ms: Option<f64>,
    /// Coordinator resident memory at the end of the window, MiB.
    pub rss_mib: Option<f64>,
    /// Coordinator peak resident memory, MiB.
    pub rss_peak_mib: Option<f64>,
    /// Coordinator resident memory right after the submit, MiB.
    pub rss_after_submit_mib: Option<f64>,
    /// Coordinator CPU over the window, percent of one core.
    pub cpu_pct: Option<f64>,
    /// The load generator's own CPU over the window, percent of one core.
    pub load_cpu_pct: Option<f64>,
    /// `tessera_leases_expired_total` at the end (must be 0).
    pub leases_expired: Option<f64>,
    /// Leases the fake workers were told they had lost.
    pub lost: u64,
    /// Calls that failed otherwise (workers and watchers).
    pub errors: u64,
    /// The last of those failures.
    pub last_error: Option<String>,
}

impl Report {
    /// Whether the run measured what it was meant to.
    pub fn ok(&self) -> bool {
        self.outcome == "ok"
    }

    /// One JSON line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serialises")
    }

    /// The column headers of [`Report::row`].
    pub fn header() -> String {
        let mut s = format!("{:<10}{:>6}{:>4}{:>9}", "design", "W", "S", "tasks");
        for c in COLUMNS {
            s.push_str(&format!("{:>w$}", c.name, w = c.width));
        }
        s
    }

    /// The figures as one table row.
    pub fn row(&self) -> String {
        let mut s = format!(
            "{:<10}{:>6}{:>4}{:>9}",
            self.design,
            self.workers,
            self.slots,
            count(self.tasks)
        );
        for c in COLUMNS {
            s.push_str(&format!("{:>w$}", cell_text(self, c), w = c.width));
        }
        if !self.ok() {
            s.push_str(&format!("  ({})", self.outcome));
        }
        s
    }
}

/// A measure shown in the tables.
struct Column {
    name: &'static str,
    width: usize,
    decimals: usize,
    get: fn(&Report) -> Option<f64>,
}

/// The measures, in table order.
const COLUMNS: &[Column] = &[
    Column {
        name: "compl/s",
        width: 10,
        decimals: 1,
        get: |r| r.completions_per_s,
    },
    Column {
        name: "lease p50",
        width: 11,
        decimals: 2,
        get: |r| r.lease_p50_ms,
    },
    Column {
        name: "lease p99",
        width: 11,
        decimals: 2,
        get: |r| r.lease_p99_ms,
    },
    Column {
        name: "idle p99",
        width: 10,
        decimals: 2,
        get: |r| r.idle_p99_ms,
    },
    Column {
        name: "compl p99",
        width: 11,
        decimals: 2,
        get: |r| r.complete_p99_ms,
    },
    Column {
        name: "result p99",
        width: 12,
        decimals: 2,
        get: |r| r.result_p99_ms,
    },
    Column {
        name: "status p99",
        width: 12,
        decimals: 2,
        get: |r| r.status_p99_ms,
    },
    Column {
        name: "RSS MiB",
        width: 9,
        decimals: 0,
        get: |r| r.rss_mib,
    },
    Column {
        name: "CPU %",
        width: 8,
        decimals: 0,
        get: |r| r.cpu_pct,
    },
    // The coordinator's CPU time per completion, everything it does in the
    // window included (leases, renewals, status): what a wave of results
    // arriving together costs it, result by result.
    Column {
        name: "CPU us/compl",
        width: 14,
        decimals: 0,
        get: |r| Some(r.cpu_pct? * 10_000.0 / r.completions_per_s.filter(|c| *c > 0.0)?),
    },
    Column {
        name: "expired",
        width: 9,
        decimals: 0,
        get: |r| r.leases_expired,
    },
    Column {
        name: "submit s",
        width: 10,
        decimals: 2,
        get: |r| r.submit_s,
    },
    Column {
        name: "load CPU %",
        width: 12,
        decimals: 0,
        get: |r| r.load_cpu_pct,
    },
];

/// `12k`, `1M`: task counts as the sweep names them.
fn count(n: u32) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

fn number(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

/// A measure of a run as printed: its value; for a run that did not finish,
/// `timeout` (or `error`) in the first column; `-` where nothing was measured.
fn cell_text(r: &Report, c: &Column) -> String {
    let first = std::ptr::eq(c, &COLUMNS[0]);
    match (c.get)(r) {
        Some(v) => number(v, c.decimals),
        None if first => failed(&r.outcome).unwrap_or("-").into(),
        None => "-".into(),
    }
}

/// `timeout` or `error` for an outcome that says so.
fn failed(outcome: &str) -> Option<&'static str> {
    if outcome.starts_with("timeout") {
        Some("timeout")
    } else if outcome.starts_with("error") {
        Some("error")
    } else {
        None
    }
}

/// `new / baseline` of one measure, when both were measured.
fn ratio(new: Option<f64>, base: Option<f64>) -> String {
    match (new, base) {
        (Some(n), Some(b)) if b != 0.0 => format!("{:.2}", n / b),
        (Some(0.0), Some(_)) => "1.00".into(),
        _ => "-".into(),
    }
}

/// One design's runs of one cell, as the table shows them: per column the
/// median over the runs that measured it (one run: its value), or why no
/// run finished.
struct Summary {
    values: Vec<Option<f64>>,
    runs: usize,
    /// The outcome of a run that did not finish, when none did.
    failure: Option<String>,
}

impl Summary {
    fn of(runs: &[&Report]) -> Self {
        let ok: Vec<&&Report> = runs.iter().filter(|r| r.ok()).collect();
        let values = COLUMNS
            .iter()
            .map(|c| median(ok.iter().filter_map(|r| (c.get)(r)).collect()))
            .collect();
        let failure = match (ok.is_empty(), runs.first()) {
            (true, Some(r)) => Some(r.outcome.clone()),
            (true, None) => Some("not run".into()),
            _ => None,
        };
        Self {
            values,
            runs: ok.len(),
            failure,
        }
    }

    fn text(&self, i: usize) -> String {
        match self.values[i] {
            Some(v) => number(v, COLUMNS[i].decimals),
            None if i == 0 => self
                .failure
                .as_deref()
                .and_then(failed)
                .unwrap_or("-")
                .into(),
            None => "-".into(),
        }
    }
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// One table of two designs' runs: per cell (workers x tasks) three lines,
/// the new design, the baseline and their ratio (new / baseline) per column.
/// A cell run several times (`ROUNDS` in the benchmark script) shows each
/// column's median over its finished runs, and the ratio of the medians:
/// single low-load latencies swing by 2x and more from run to run.
pub fn compare(new: &[Report], baseline: &[Report]) -> String {
    let mut cells: Vec<(u32, u32)> = new
        .iter()
        .chain(baseline)
        .map(|r| (r.workers, r.tasks))
        .collect();
    cells.sort_unstable_by_key(|&(w, t)| (t, w));
    cells.dedup();
    let mut out = format!("{:<16}{:<14}", "cell", "design");
    for c in COLUMNS {
        out.push_str(&format!("{:>w$}", c.name, w = c.width));
    }
    out.push('\n');
    for (w, t) in cells {
        let find = |rs: &[Report], name: &str| {
            let runs: Vec<&Report> = rs
                .iter()
                .filter(|r| r.workers == w && r.tasks == t)
                .collect();
            let s = Summary::of(&runs);
            let design = match (runs.len(), s.runs) {
                (0 | 1, _) => name.to_string(),
                (all, ok) if ok == all => format!("{name} x{all}"),
                (all, ok) => format!("{name} {ok}/{all}"),
            };
            (s, design)
        };
        let ((n, nd), (b, bd)) = (find(new, "new"), find(baseline, "baseline"));
        let label = format!("W={w} N={}", count(t));
        for (cell, design, r) in [(label.as_str(), nd, &n), ("", bd, &b)] {
            out.push_str(&format!("{cell:<16}{design:<14}"));
            for (i, c) in COLUMNS.iter().enumerate() {
                out.push_str(&format!("{:>w$}", r.text(i), w = c.width));
            }
            if let Some(why) = &r.failure {
                out.push_str(&format!("  ({why})"));
            }
            out.push('\n');
        }
        out.push_str(&format!("{:<16}{:<14}", "", "ratio"));
        for (i, c) in COLUMNS.iter().enumerate() {
            out.push_str(&format!(
                "{:>w$}",
                ratio(n.values[i], b.values[i]),
                w = c.width
            ));
        }
        out.push('\n');
    }
    out.push_str(
        "ratio = new / baseline: above 1 is better for compl/s, below 1 for the other columns\n",
    );
    out.push_str("xR: the median of R runs per column (2/3: two of three runs finished)\n");
    out
}

/// The recovery measure: a coordinator killed with SIGKILL with a large job
/// on disk, restarted on the same data directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Recovery {
    /// Which coordinator ran.
    pub design: String,
    /// Tasks on disk.
    pub tasks: u32,
    /// `ok`, `timeout: STEP` or `error: MESSAGE`.
    pub outcome: String,
    /// Seconds the `SubmitJob` of the whole job took.
    pub submit_s: Option<f64>,
    /// Coordinator resident memory after the submit, MiB.
    pub rss_mib: Option<f64>,
    /// From the restart to the coordinator listening, seconds.
    pub listening_s: Option<f64>,
    /// From the restart to the first lease served, seconds.
    pub first_lease_s: Option<f64>,
    /// Coordinator resident memory once it served that lease, MiB.
    pub rss_after_mib: Option<f64>,
}

impl Recovery {
    /// One JSON line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serialises")
    }

    /// A few lines for one design.
    pub fn lines(&self) -> String {
        let f = |v: Option<f64>, d: usize| v.map_or_else(|| "-".to_string(), |v| number(v, d));
        format!(
            "{}: {} tasks on disk, {}: submit {} s, RSS {} MiB; after kill -9: listening in {} s, first lease in {} s, RSS {} MiB",
            self.design,
            count(self.tasks),
            self.outcome,
            f(self.submit_s, 2),
            f(self.rss_mib, 0),
            f(self.listening_s, 2),
            f(self.first_lease_s, 2),
            f(self.rss_after_mib, 0)
        )
    }
}

/// The recovery measures of two designs side by side.
pub fn compare_recovery(new: &Recovery, baseline: &Recovery) -> String {
    type Get = fn(&Recovery) -> Option<f64>;
    let rows: [(&str, Get, usize); 5] = [
        ("submit s", |r| r.submit_s, 2),
        ("RSS after submit MiB", |r| r.rss_mib, 0),
        ("restart to listening s", |r| r.listening_s, 2),
        ("restart to first lease s", |r| r.first_lease_s, 2),
        ("RSS after recovery MiB", |r| r.rss_after_mib, 0),
    ];
    let mut out = format!(
        "recovery with {} tasks on disk (kill -9, restart)\n{:<28}{:>12}{:>12}{:>8}\n",
        count(new.tasks.max(baseline.tasks)),
        "measure",
        "new",
        "baseline",
        "ratio"
    );
    let text = |r: &Recovery, v: Option<f64>, d: usize| match v {
        Some(v) => number(v, d),
        None => failed(&r.outcome).unwrap_or("-").into(),
    };
    for (name, get, d) in rows {
        let (n, b) = (get(new), get(baseline));
        let ratio = match (n, b) {
            (Some(n), Some(b)) if b != 0.0 => format!("{:.2}", n / b),
            _ => "-".into(),
        };
        out.push_str(&format!(
            "{name:<28}{:>12}{:>12}{ratio:>8}\n",
            text(new, n, d),
            text(baseline, b, d)
        ));
    }
    for r in [new, baseline] {
        if failed(&r.outcome).is_some() {
            out.push_str(&format!("{}: {}\n", r.design, r.outcome));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(design: &str, w: u32, t: u32, cps: Option<f64>, outcome: &str) -> Report {
        Report {
            design: design.into(),
            workers: w,
            tasks: t,
            outcome: outcome.into(),
            completions_per_s: cps,
            lease_p99_ms: cps.map(|c| 1000.0 / c),
            ..Default::default()
        }
    }

    #[test]
    fn a_report_survives_json() {
        let r = run("new", 10, 10_000, Some(5.0), "ok");
        let back: Report = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn the_table_pairs_cells_and_says_timeout() {
        let new = [
            run("new", 10, 10_000, Some(500.0), "ok"),
            run("new", 100, 1_000_000, Some(400.0), "ok"),
        ];
        let base = [
            run("baseline", 10, 10_000, Some(100.0), "ok"),
            run(
                "baseline",
                100,
                1_000_000,
                None,
                "timeout: submitting a 1000000-task job",
            ),
        ];
        let table = compare(&new, &base);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].starts_with("W=10 N=10k"), "{table}");
        assert!(lines[3].contains("5.00"), "{table}");
        assert!(lines[4].starts_with("W=100 N=1M"), "{table}");
        assert!(lines[5].contains("timeout"), "{table}");
        assert_eq!(lines[5].matches("timeout").count(), 2, "{table}");
        assert!(
            lines[6].split_whitespace().skip(1).all(|c| c == "-"),
            "{table}"
        );
    }

    #[test]
    fn repeated_runs_show_each_columns_median_and_the_ratio_of_medians() {
        let cell =
            |design: &str, cps: Option<f64>, outcome: &str| run(design, 10, 10_000, cps, outcome);
        let new = [
            cell("new", Some(100.0), "ok"),
            cell("new", Some(400.0), "ok"),
            cell("new", Some(200.0), "ok"),
        ];
        let base = [
            cell("baseline", Some(80.0), "ok"),
            cell("baseline", None, "timeout: the window"),
            cell("baseline", Some(120.0), "ok"),
        ];
        let table = compare(&new, &base);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].contains("new x3"), "{table}");
        assert!(lines[1].contains("200.0"), "{table}");
        assert!(lines[2].contains("baseline 2/3"), "{table}");
        assert!(lines[2].contains("100.0"), "{table}");
        assert!(
            lines[3].split_whitespace().nth(1) == Some("2.00"),
            "{table}"
        );
        // lease p99 = 1000 / compl/s here: a column's own median (5.00 of
        // 10, 2.5 and 5; 10.42 of 12.5 and 8.33), not the best run's value.
        assert!(lines[1].contains("5.00"), "{table}");
        assert!(lines[2].contains("10.42"), "{table}");
        assert!(
            lines[3].split_whitespace().nth(3) == Some("0.48"),
            "{table}"
        );
    }

    #[test]
    fn counts_read_as_the_sweep_names_them() {
        assert_eq!(count(10_000), "10k");
        assert_eq!(count(1_000_000), "1M");
        assert_eq!(count(2500), "2500");
    }
}
