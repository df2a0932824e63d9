//! Verifiable frames end to end: real coordinator, real workers, real
//! Blender. Workers strip Blender's volatile stamps, so one frame rendered
//! by two workers has one digest; `--verify` renders tasks twice on different
//! workers, and a worker that changes a pixel is caught and marked suspect.

use std::path::Path;
use std::time::Duration;

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(240);

fn done(url: &str, job: u64) -> serde_json::Value {
    wait_for(url, job, LONG, "the job to finish", |v| {
        v["state"] != "queued" && v["state"] != "running"
    })
}

fn fetch(url: &str, job: u64, out: &Path) {
    cli_ok(
        url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
}

/// Prometheus samples by name (no labels here).
fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
}

#[test]
fn one_frame_from_two_workers_has_identical_digests_and_bytes() {
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    // Caches at paths of different lengths: Blender stamps the scene's path.
    let _a = worker_with(&coord.url, dir.path(), "a", &["--tag", "a"]);
    let _b = worker_with(&coord.url, dir.path(), "bb-other", &["--tag", "b"]);
    for format in ["PNG", "EXR"] {
        let scene = scene(&["--kind", "anim", "--frames", "2", "--format", format]);
        let on_a = submit(&coord.url, &scene, &["--frames", "1-2", "--tag", "a"]);
        let on_b = submit(&coord.url, &scene, &["--frames", "1-2", "--tag", "b"]);
        let (va, vb) = (done(&coord.url, on_a), done(&coord.url, on_b));
        assert_eq!(
            (&va["state"], &vb["state"]),
            (&"done".into(), &"done".into())
        );
        // Frames are blobs named by their blake3 digest: equal bytes, equal digests.
        let (oa, ob) = (
            dir.path().join(format!("a-{format}")),
            dir.path().join(format!("b-{format}")),
        );
        fetch(&coord.url, on_a, &oa);
        fetch(&coord.url, on_b, &ob);
        let ext = if format == "PNG" { "png" } else { "exr" };
        for f in 1..=2 {
            let name = format!("frame_{f:04}.{ext}");
            let (ba, bb) = (
                std::fs::read(oa.join(&name)).unwrap(),
                std::fs::read(ob.join(&name)).unwrap(),
            );
            assert_eq!(
                blake3::hash(&ba),
                blake3::hash(&bb),
                "{format} frame {f}: the digests differ"
            );
            assert_eq!(ba, bb, "{format} frame {f}: bytes differ");
            for stamp in ["RenderTime", "Date", "total_time", ".blend"] {
                assert!(
                    !ba.windows(stamp.len()).any(|w| w == stamp.as_bytes()),
                    "{format} frame {f} still holds {stamp}"
                );
            }
        }
        // What Blender stamped is in the job's per-frame stats instead.
        let stats = va["frame_stats"].as_array().unwrap();
        assert_eq!(stats.len(), 2, "{va:#}");
        for s in stats {
            assert_eq!(s["samples"], 8, "make_scene's default samples: {s}");
        }
        let human = cli_ok(&coord.url, &["status", &on_a.to_string()]);
        assert!(
            human.contains("SAMPLES") && human.contains("RENDER"),
            "{human}"
        );
    }
    // A PNG frame equals a plain Blender render, pixel for pixel.
    let scene = scene(&["--kind", "anim", "--frames", "2", "--format", "PNG"]);
    let refs = dir.path().join("refs");
    reference(&scene, 1, 2, &refs);
    for f in 1..=2 {
        assert_same_pixels(
            &dir.path().join(format!("a-PNG/frame_{f:04}.png")),
            &refs.join(format!("ref_{f:04}.png")),
        );
    }
}

#[test]
fn a_corrupting_worker_is_caught_and_its_frames_never_delivered() {
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0"],
    );
    let scene = scene(&["--kind", "anim", "--frames", "4", "--samples", "4"]);
    // The liar starts alone, so it surely renders a task before the others come.
    let _bad = worker_with(&coord.url, dir.path(), "bad", &["--test-corrupt-pixel"]);
    let job = submit(&coord.url, &scene, &["--frames", "1-4", "--verify", "1.0"]);
    let bad_id = wait_for(&coord.url, job, LONG, "the liar's first result", |v| {
        v["tasks_verifying"].as_u64().unwrap_or(0) > 0
    });
    let bad_id = bad_id["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|t| {
            let v = t["verification"].as_str()?;
            v.strip_prefix("verifying: result of ")?
                .strip_suffix(" held")
                .map(str::to_string)
        })
        .expect("a held result");
    let _a = worker_with(&coord.url, dir.path(), "a", &[]);
    let _c = worker_with(&coord.url, dir.path(), "c", &[]);
    let v = done(&coord.url, job);
    assert_eq!(v["state"], "done", "{v:#}");

    // The liar is suspect; the honest workers are not.
    let workers = workers_by_name(&coord.url);
    assert_eq!(workers["bad"]["id"], bad_id.as_str());
    let why = workers["bad"]["suspect"].as_str().unwrap();
    assert!(why.contains(&format!("job {job}")), "{why}");
    for honest in ["a", "c"] {
        assert_eq!(workers[honest]["suspect"], "", "{honest} is not suspect");
    }
    let table = cli_ok(&coord.url, &["workers"]);
    assert!(table.contains("suspect"), "{table}");
    // Every task was checked by two workers that agree, never by the liar.
    for t in v["tasks"].as_array().unwrap() {
        let word = t["verification"].as_str().unwrap();
        assert!(word.starts_with("verified by "), "{t}");
        let agreed = word
            .trim_start_matches("verified by ")
            .split(';')
            .next()
            .unwrap();
        assert!(!agreed.contains(&bad_id), "{t}");
    }

    // Every delivered frame equals a plain Blender render.
    let out = dir.path().join("out");
    fetch(&coord.url, job, &out);
    let refs = dir.path().join("refs");
    reference(&scene, 1, 4, &refs);
    for f in 1..=4 {
        assert_same_pixels(
            &out.join(format!("frame_{f:04}.png")),
            &refs.join(format!("ref_{f:04}.png")),
        );
    }

    // The counters moved; the JSON API shows the suspect too.
    let token = coord.admin_token();
    let (_, body) = http_get_as(coord.metrics.as_ref().unwrap(), Some(&token));
    assert!(
        metric(&body, "tessera_verify_mismatches_total") >= 1.0,
        "{body}"
    );
    assert!(
        metric(&body, "tessera_verify_checks_total") >= 5.0,
        "{body}"
    );
    let api = coord
        .metrics
        .as_ref()
        .unwrap()
        .replace("/metrics", "/api/v1/workers");
    let (_, body) = http_get_as(&api, Some(&token));
    assert!(body.contains("\"suspect\":\"its frames of job"), "{body}");

    // The dashboard's worker list marks it; the job page lists the frames' stats.
    let base = coord.metrics.as_ref().unwrap().replace("/metrics", "");
    dashboard_shows(&base, &token, &bad_id, job, dir.path());
}

/// Signs in to the dashboard and checks the suspect worker's card and the
/// job's render statistics.
fn dashboard_shows(base: &str, token: &str, suspect: &str, job: u64, dir: &Path) {
    use tessera_tests::browser::{chromium, Browser};
    let Some(binary) = chromium() else {
        eprintln!("SKIPPED the dashboard part: chromium is not installed (scripts/test.sh installs it; or set TESSERA_CHROMIUM)");
        return;
    };
    let mut b = Browser::start(&binary, dir, 1280, 900);
    b.sign_in(&format!("{base}/workers"), token);
    b.goto(&format!("{base}/workers"));
    let card = format!("document.querySelector('[data-worker=\"{suspect}\"] [data-suspect]')");
    assert!(
        b.wait_for(&card, Duration::from_secs(20)),
        "no suspect mark on {suspect}: {}",
        b.eval("document.body.innerText")
    );
    assert_eq!(
        b.eval("document.querySelectorAll('[data-suspect]').length"),
        serde_json::json!(1)
    );
    b.goto(&format!("{base}/jobs/{job}"));
    assert!(
        b.wait_for(
            "document.querySelectorAll('#frame-stats tr').length === 5",
            Duration::from_secs(20)
        ),
        "no render statistics: {}",
        b.eval("document.body.innerText")
    );
}

#[test]
fn a_lone_worker_job_says_it_awaits_verification() {
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let scene = scene(&["--kind", "anim", "--frames", "1", "--samples", "2"]);
    let _a = worker_with(&coord.url, dir.path(), "a", &[]);
    let job = submit(&coord.url, &scene, &["--frames", "1", "--verify", "0.05"]);
    let v = wait_for(&coord.url, job, LONG, "the waiting message", |v| {
        v["waiting"]
            .as_str()
            .unwrap_or("")
            .contains("awaits verification")
    });
    assert_eq!(v["state"], "running", "{v:#}");
    assert!(v["outputs"].as_array().unwrap().is_empty(), "not delivered");
    let human = cli_ok(&coord.url, &["status", &job.to_string()]);
    assert!(human.contains("start another worker"), "{human}");
}

#[test]
fn verify_takes_a_fraction_and_render_refuses_it() {
    let scene = scene(&["--kind", "anim", "--frames", "1"]);
    let s = scene.to_str().unwrap();
    let bad = cli("http://127.0.0.1:9", &["submit", s, "--verify", "1.5"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("from 0 to 1"),
        "{err}"
    );
    let out = scratch();
    let local = cli(
        "http://127.0.0.1:9",
        &[
            "render",
            s,
            "--verify",
            "0.5",
            "-o",
            out.path().to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&local.stderr);
    assert!(
        !local.status.success() && err.contains("different worker"),
        "{err}"
    );
}
