//! Workers' hardware end to end: the real GPU probe (lavapipe), jobs matched
//! to the slots that can serve them, GPU health draining a worker, and the
//! Prometheus metrics.
//!
//! GPUs other than lavapipe are declared with the test-only `--fake-gpu`
//! flag: such a slot is matched as that GPU but renders on the CPU.

use std::time::Duration;

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

fn done(url: &str, job: u64) -> serde_json::Value {
    let v = wait_for(url, job, LONG, "the job to end", |j| {
        matches!(j["state"].as_str(), Some("done" | "failed" | "canceled"))
    });
    assert_eq!(v["state"], "done", "{v:#}");
    v
}

/// Tasks of `job` that the worker's log says it completed.
fn tasks_done_by(w: &Proc, job: u64) -> usize {
    w.log()
        .lines()
        .filter(|l| l.contains("task done") && l.contains(&format!("lease={job}.")))
        .count()
}

#[test]
fn the_probe_finds_the_vulkan_device_for_real() {
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let _w = worker_with(&coord.url, dir.path(), "probe", &[]);
    assert!(eventually(Duration::from_secs(30), || workers_by_name(
        &coord.url
    )
    .contains_key("probe")));
    let w = &workers_by_name(&coord.url)["probe"];
    // scripts/test.sh installs Debian's mesa-vulkan-drivers: lavapipe, a real
    // Vulkan implementation on the CPU.
    let gpus = w["gpus"].as_array().unwrap();
    let lavapipe = gpus
        .iter()
        .find(|g| g["name"].as_str().unwrap().contains("llvmpipe"));
    let lavapipe =
        lavapipe.unwrap_or_else(|| panic!("no llvmpipe device found; probe notes: {}", w["notes"]));
    assert_eq!(lavapipe["type"], "cpu");
    assert!(lavapipe["memory_bytes"].as_u64().unwrap() > 0);
    // Not an NVIDIA GPU: the worker renders with CPU slots.
    assert_eq!(w["device"], "cpu");
    assert!(
        w["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("NVML")),
        "{w:#}"
    );
    assert!(w["memory_bytes"].as_u64().unwrap() > 0 && w["cpu_cores"].as_u64().unwrap() > 0);
    let table = cli_ok(&coord.url, &["workers"]);
    assert!(
        table.contains("llvmpipe") && table.contains("GiB"),
        "{table}"
    );
}

#[test]
fn tasks_go_only_to_slots_that_can_serve_them() {
    let scene = tiny_scene("anim", 4, 2);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let big = worker_with(
        &coord.url,
        dir.path(),
        "big",
        &["--fake-gpu", "RTX 4090:24", "--tag", "studio"],
    );
    let small = worker_with(
        &coord.url,
        dir.path(),
        "small",
        &["--fake-gpu", "RTX 3060:12"],
    );
    let cpu = worker_with(
        &coord.url,
        dir.path(),
        "cpu",
        &["--device", "cpu", "--slots", "1"],
    );
    assert!(eventually(Duration::from_secs(30), || workers_by_name(
        &coord.url
    )
    .len()
        == 3));
    let ws = workers_by_name(&coord.url);
    assert_eq!(ws["big"]["slots_info"][0]["device"], "optix");
    assert_eq!(ws["big"]["slots_info"][0]["vram_bytes"], 24u64 << 30);
    assert_eq!(ws["cpu"]["slots_info"][0]["device"], "cpu");

    let optix24 = submit(
        &coord.url,
        &scene,
        &["--frames", "1-2", "--device", "optix", "--min-vram", "24"],
    );
    let on_cpu = submit(&coord.url, &scene, &["--frames", "1-2", "--device", "cpu"]);
    let tagged = submit(&coord.url, &scene, &["--frames", "1-2", "--tag", "studio"]);
    let cuda12 = submit(
        &coord.url,
        &scene,
        &["--frames", "1-2", "--device", "cuda", "--min-vram", "12"],
    );
    let nobody = submit(
        &coord.url,
        &scene,
        &["--frames", "1", "--device", "optix", "--min-vram", "48"],
    );
    for job in [optix24, on_cpu, tagged, cuda12] {
        done(&coord.url, job);
    }
    assert_eq!(tasks_done_by(&big, optix24), 2);
    assert_eq!(tasks_done_by(&cpu, on_cpu), 2);
    assert_eq!(tasks_done_by(&big, tagged), 2);
    assert_eq!(
        tasks_done_by(&cpu, cuda12),
        0,
        "a CPU slot never gets a cuda job"
    );
    assert_eq!(
        tasks_done_by(&big, cuda12) + tasks_done_by(&small, cuda12),
        2
    );

    let waiting = status(&coord.url, nobody);
    assert_eq!(waiting["state"], "queued");
    assert_eq!(
        waiting["waiting"], "waiting: no available worker with optix and 48 GB",
        "{waiting:#}"
    );
    let human = cli_ok(&coord.url, &["status", &nobody.to_string()]);
    assert!(
        human.contains("waiting: no available worker with optix and 48 GB"),
        "{human}"
    );
    let bad = cli(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1",
            "--device",
            "metal",
        ],
    );
    assert!(String::from_utf8_lossy(&bad.stderr).contains("use any, cpu, cuda or optix"));
}

#[test]
fn a_hot_gpu_drains_its_worker_until_it_cools_and_metrics_show_it() {
    let scene = tiny_scene("anim", 4, 2);
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0", "--max-gpu-temp", "90"],
    );
    let telemetry = dir.path().join("telemetry.json");
    let write = |temp: u32, ecc: u64| {
        let json = format!(
            r#"[{{"temperature_c": {temp}, "utilization_pct": 87, "memory_used_bytes": 3221225472, "power_w": 312.5, "ecc_errors": {ecc}}}]"#
        );
        std::fs::write(&telemetry, json).unwrap();
    };
    write(95, 0);
    let _w = worker_with(
        &coord.url,
        dir.path(),
        "hot",
        &[
            "--fake-gpu",
            "RTX 4090:24",
            "--fake-telemetry",
            telemetry.to_str().unwrap(),
            "--telemetry-interval",
            "0.2",
        ],
    );
    assert!(
        eventually(Duration::from_secs(30), || workers_by_name(&coord.url)
            .get("hot")
            .is_some_and(|w| w["state"] == "draining")),
        "a GPU at 95 °C drains the worker"
    );
    let w = &workers_by_name(&coord.url)["hot"];
    assert!(
        w["drain_reason"]
            .as_str()
            .unwrap()
            .contains("95 °C (limit 90 °C)"),
        "{w:#}"
    );
    let table = cli_ok(&coord.url, &["workers"]);
    assert!(
        table.contains("draining") && table.contains("95 °C"),
        "{table}"
    );

    // One task a frame, so that the queued tasks the metrics count are two.
    let job = submit(&coord.url, &scene, &["--frames", "1-2", "--chunk", "1"]);
    // The worker's lease call, parked before the submit, is woken by the
    // ready tasks and refused; the coordinator's log below shows that no
    // task was leased until the worker was back in service.
    let queued = status(&coord.url, job);
    assert_eq!(
        queued["tasks_done"], 0,
        "a draining worker takes no new work"
    );
    assert_eq!(queued["tasks_running"], 0);
    assert!(
        queued["waiting"].as_str().unwrap().starts_with("waiting:"),
        "{queued:#}"
    );

    let metrics_url = coord.metrics.clone().unwrap();
    let (refused, _) = http_get(&metrics_url);
    assert!(refused.contains("401"), "metrics need a token: {refused}");
    let token = coord.admin_token();
    let (status_line, body) = http_get_as(&metrics_url, Some(&token));
    assert!(status_line.contains("200"), "{status_line}");
    let samples = parse_prometheus(&body);
    assert_eq!(
        samples.get(r#"tessera_workers{state="draining"}"#),
        Some(&1.0),
        "{body}"
    );
    assert_eq!(samples.get(r#"tessera_tasks{state="queued"}"#), Some(&2.0));
    // The declared GPU comes after any probed one (lavapipe here).
    let index = w["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "RTX 4090")
        .unwrap()["index"]
        .clone();
    let gpu = format!(r#"{{worker="w1",gpu="{index}",name="RTX 4090"}}"#);
    assert_eq!(
        samples.get(&format!("tessera_gpu_temperature_celsius{gpu}")),
        Some(&95.0),
        "{body}"
    );
    assert_eq!(
        samples.get(&format!("tessera_gpu_utilization_ratio{gpu}")),
        Some(&0.87)
    );
    assert_eq!(
        samples.get(&format!("tessera_gpu_memory_used_bytes{gpu}")),
        Some(&3221225472.0)
    );
    assert_eq!(
        samples.get(&format!("tessera_gpu_memory_total_bytes{gpu}")),
        Some(&(24.0 * 1073741824.0))
    );

    // It cools down: back in service, and the job runs.
    write(60, 0);
    done(&coord.url, job);
    assert_eq!(workers_by_name(&coord.url)["hot"]["state"], "online");
    let log = coord.proc.log();
    let restored = log
        .find("healthy again; back in service")
        .unwrap_or_else(|| panic!("no line saying the worker is back in service:\n{log}"));
    let first_lease = log
        .find("task leased")
        .unwrap_or_else(|| panic!("no task leased:\n{log}"));
    assert!(
        restored < first_lease,
        "a draining worker takes no new work: a task was leased before it was back in service:\n{log}"
    );

    // ECC errors rising past the limit drain it again.
    write(60, 25);
    assert!(
        eventually(Duration::from_secs(30), || workers_by_name(&coord.url)
            ["hot"]["drain_reason"]
            .as_str()
            .is_some_and(|r| r.contains("25 ECC errors"))),
        "rising ECC errors drain the worker"
    );

    let (_, body) = http_get_as(&metrics_url, Some(&token));
    let samples = parse_prometheus(&body);
    for series in [
        r#"tessera_tasks{state="done"}"#,
        r#"tessera_jobs{state="done"}"#,
        "tessera_leases_active",
        "tessera_leases_granted_total",
        r#"tessera_task_duration_seconds_bucket{le="+Inf"}"#,
        "tessera_task_duration_seconds_count",
        "tessera_frames_rendered_total",
        r#"tessera_workers{state="idle"}"#,
    ] {
        assert!(samples.contains_key(series), "missing {series} in:\n{body}");
    }
    assert_eq!(samples["tessera_frames_rendered_total"], 2.0);
    assert_eq!(samples["tessera_task_duration_seconds_count"], 2.0);
    // Every granted lease is timed, from the try that found its task to the
    // lease being stored.
    assert_eq!(
        samples["tessera_lease_seconds_count"], samples["tessera_leases_granted_total"],
        "each granted lease is timed:\n{body}"
    );
    assert!(samples["tessera_lease_seconds_sum"] > 0.0);
}

#[test]
fn a_gpu_blender_cannot_use_stops_its_slot_from_taking_gpu_work() {
    // Debian's Blender has no CUDA: forcing --device cuda on a declared GPU
    // makes Blender say it found no such device.
    let scene = tiny_scene("anim", 4, 2);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let w = worker_with(
        &coord.url,
        dir.path(),
        "nocuda",
        &[
            "--fake-gpu",
            "RTX 4090:24",
            "--device",
            "cuda",
            "--telemetry-interval",
            "0.2",
        ],
    );
    let job = submit(
        &coord.url,
        &scene,
        &["--frames", "1", "--device", "cuda", "--max-attempts", "1"],
    );
    let failed = wait_for(&coord.url, job, LONG, "the job to fail", |j| {
        j["state"] == "failed" || j["state"] == "done"
    });
    assert_eq!(failed["state"], "failed");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("Found no Cycles device of the specified type"),
        "{failed:#}"
    );
    assert!(
        eventually(Duration::from_secs(10), || workers_by_name(&coord.url)
            ["nocuda"]["slots_info"][0]["device"]
            == "cpu"),
        "the slot gives up GPU work:\n{}",
        w.log()
    );
    let again = submit(&coord.url, &scene, &["--frames", "1", "--device", "cuda"]);
    assert!(
        eventually(Duration::from_secs(10), || status(&coord.url, again)
            ["waiting"]
            == "waiting: no available worker with cuda"),
        "{:#}",
        status(&coord.url, again)
    );
    let cpu_job = submit(&coord.url, &scene, &["--frames", "1", "--device", "cpu"]);
    done(&coord.url, cpu_job);
}

/// Parses Prometheus text format strictly enough to catch malformed output:
/// every line is a comment (`# HELP`/`# TYPE`) or `name{labels} value`.
fn parse_prometheus(body: &str) -> std::collections::HashMap<String, f64> {
    let mut out = std::collections::HashMap::new();
    let mut typed = std::collections::HashSet::new();
    for line in body.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().expect("comment names a metric");
            assert!(kind == "HELP" || kind == "TYPE", "bad comment: {line}");
            if kind == "TYPE" {
                let t = parts.next().unwrap();
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&t),
                    "{line}"
                );
                typed.insert(name.to_string());
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample line: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name: {line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(
                    labels.starts_with('{') && labels.ends_with('}'),
                    "bad labels: {line}"
                );
            }
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
        assert!(
            typed.contains(name) || typed.contains(family),
            "sample before its TYPE: {line}"
        );
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        out.insert(series.to_string(), v);
    }
    out
}
