//! What `status` and `workers` show of verifiable frames: per-frame render
//! statistics (moved out of the images by the workers), verification, and
//! untrusted or suspect workers.

use tessera_proto as pb;

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
pub fn job(j: &pb::JobView) {
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
    crate::show::table(&["FRAME", "RENDER", "SYNC", "SAMPLES", "PEAK MEMORY"], rows);
}

/// A worker's state, with `untrusted` and `suspect` when they apply.
pub fn state(w: &pb::WorkerView) -> String {
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
pub fn suspects(workers: &[pb::WorkerView]) {
    for w in workers.iter().filter(|w| !w.suspect.is_empty()) {
        println!("{} is suspect: {}", w.id, w.suspect);
    }
}
