//! The HTTP JSON API and the dashboard end to end: a real coordinator with
//! `--http`, a real worker and real Blender, driven over HTTP and from a
//! headless Chromium. The tests of this file share one farm, started once.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tessera_tests::browser::{chromium, Browser};
use tessera_tests::http::{get, post, request, Events};
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(180);

/// The farm every test of this file uses.
struct Farm {
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT` (the HTTP port).
    base: String,
    coord: Coordinator,
    _worker: Proc,
    admin: String,
    alice: String,
    bob: String,
}

fn user(coord: &Coordinator, admin: &str, name: &str) -> String {
    let out = cli_as(
        &coord.url,
        Some(admin),
        &["users", "add", name, "--role", "user"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Runs `f` with the shared farm, starting it for the first test. The farm
/// lives as long as the test process; a watchdog stops its processes and
/// removes its folder when the process ends, whichever tests ran.
fn with_farm(f: impl FnOnce(&Farm)) {
    static SHARED: OnceLock<Farm> = OnceLock::new();
    f(SHARED.get_or_init(start_farm));
}

// The watchdog outlives this process on purpose (init reaps it).
#[allow(clippy::zombie_processes)]
fn start_farm() -> Farm {
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0", "--max-upload-mib", "8"],
    );
    let base = coord
        .metrics
        .clone()
        .unwrap()
        .trim_end_matches("/metrics")
        .to_string();
    let admin = coord.admin_token();
    let alice = user(&coord, &admin, "alice");
    let bob = user(&coord, &admin, "bob");
    let worker = worker(&coord.url, dir.path(), "w1");
    std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"while kill -0 "$0" 2>/dev/null; do sleep 1; done; kill -TERM "$2"; sleep 3; kill -9 "$1" "$2"; rm -rf "$3""#)
        .arg(std::process::id().to_string())
        .arg(coord.proc.child.id().to_string())
        .arg(worker.child.id().to_string())
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    Farm {
        base,
        _worker: worker,
        admin,
        alice,
        bob,
        coord,
        dir,
    }
}

fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Uploads `path` as `token` (if missing); its digest.
fn upload(farm: &Farm, token: &str, path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    let d = digest(&bytes);
    let missing = post(
        &format!("{}/api/v1/blobs/missing", farm.base),
        token,
        &json!({"digests": [d]}),
    );
    assert_eq!(missing.status, 200, "{}", missing.json());
    if missing.json()["missing"] == json!([d]) {
        let r = request(
            "PUT",
            &format!("{}/api/v1/blobs/{d}", farm.base),
            Some(token),
            &[],
            &bytes,
        );
        assert_eq!(r.status, 200, "{}", r.json());
        assert_eq!(r.json()["digest"], json!(d));
        assert_eq!(r.json()["size"], json!(bytes.len()));
    }
    d
}

fn submit(farm: &Farm, token: &str, spec: Value) -> u64 {
    let r = post(&format!("{}/api/v1/jobs", farm.base), token, &spec);
    assert_eq!(r.status, 201, "{}", r.json());
    r.json()["job_id"].as_u64().unwrap()
}

fn png_size_and_brightness(png_bytes: &[u8]) -> (u32, u32, f64) {
    let mut r = png::Decoder::new(std::io::Cursor::new(png_bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    let info = r.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    let colour: Vec<u8> = buf.chunks(4).flat_map(|p| p[..3].to_vec()).collect();
    let mean = colour.iter().map(|&b| f64::from(b)).sum::<f64>() / colour.len().max(1) as f64;
    (info.width, info.height, mean)
}

#[test]
fn the_api_submits_follows_events_to_the_end_and_serves_frames_and_thumbnails() {
    with_farm(|farm| {
        let api = format!("{}/api/v1", farm.base);
        let who = get(&format!("{api}/whoami"), &farm.alice).json();
        assert_eq!(who["user"], "alice");
        assert_eq!(who["role"], "user");

        let anim = scene(&["--kind", "anim", "--frames", "2"]);
        let d = upload(farm, &farm.alice, &anim);
        // Uploaded once: not missing any more, and a second upload is a no-op.
        let again = post(
            &format!("{api}/blobs/missing"),
            &farm.alice,
            &json!({"digests": [d]}),
        );
        assert_eq!(again.json()["missing"], json!([]));

        let spec = json!({"scene_digest": d, "scene_name": "anim.blend", "frames": "1-2"});
        let check = post(&format!("{api}/jobs/check"), &farm.alice, &spec).json();
        assert_eq!(check["tasks"], 2);
        assert_eq!(check["frames"], 2);
        assert!(
            eventually(Duration::from_secs(30), || {
                post(&format!("{api}/jobs/check"), &farm.alice, &spec).json()["workers"] == 1
            }),
            "the worker never became able to serve the job"
        );

        // Follow the job over SSE from before it exists to its end.
        let mut events = Events::open(&format!("{api}/events"), &farm.alice);
        let (hello, body) = events.next(Duration::from_secs(10)).expect("a hello event");
        assert_eq!(
            (hello.as_str(), body["user"].as_str()),
            ("hello", Some("alice"))
        );
        let id = submit(farm, &farm.alice, spec);
        let deadline = Instant::now() + LONG;
        let mut states = Vec::new();
        let mut last_done = 0;
        loop {
            let left = deadline.checked_duration_since(Instant::now());
            let Some((kind, v)) = left.and_then(|l| events.next(l)) else {
                panic!("job {id} did not end over SSE; saw {states:?}");
            };
            if kind != "job" || v["id"] != json!(id) {
                continue;
            }
            let done = v["frames_done"].as_u64().unwrap();
            assert!(done >= last_done, "progress went back: {v}");
            last_done = done;
            let state = v["state"].as_str().unwrap().to_string();
            if states.last() != Some(&state) {
                states.push(state.clone());
            }
            if ["done", "failed", "canceled"].contains(&state.as_str()) {
                break;
            }
        }
        assert_eq!(
            states.last().map(String::as_str),
            Some("done"),
            "{states:?}"
        );
        assert_eq!(last_done, 2);

        // The job as JSON: the same object as `tessera status --json` (which
        // asks for the first 1000 tasks and no outputs).
        let job = get(&format!("{api}/jobs/{id}"), &farm.alice).json();
        let same_page = get(&format!("{api}/jobs/{id}?output_limit=0"), &farm.alice).json();
        let status = {
            let out = cli_as(
                &farm.coord.url,
                Some(&farm.alice),
                &["status", &id.to_string(), "--json"],
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice::<Value>(&out.stdout).unwrap()
        };
        assert_eq!(same_page, status);
        assert_eq!(job["outputs_total"], 2);
        assert_eq!(job["outputs"].as_array().unwrap().len(), 2);

        // A frame, byte for byte the blob the job names, and a thumbnail.
        let frame = get(&format!("{api}/jobs/{id}/frames/2"), &farm.alice);
        assert_eq!(frame.status, 200);
        assert_eq!(frame.header("content-type"), Some("image/png"));
        let out2 = job["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["frame"] == 2)
            .unwrap();
        assert_eq!(json!(digest(&frame.body)), out2["digest"]);
        let (w, h, _) = png_size_and_brightness(&frame.body);
        assert_eq!((w, h), (64, 48));
        let thumb = get(&format!("{api}/jobs/{id}/frames/2?thumb=32"), &farm.alice);
        assert_eq!(thumb.header("content-type"), Some("image/png"));
        let (tw, th, mean) = png_size_and_brightness(&thumb.body);
        assert_eq!((tw, th), (32, 24));
        assert!(mean > 5.0, "the thumbnail is black");

        // An EXR frame's thumbnail is tone-mapped, not black.
        let exr = scene(&["--kind", "still", "--format", "EXR"]);
        let d = upload(farm, &farm.alice, &exr);
        let id = submit(
            farm,
            &farm.alice,
            json!({"scene_digest": d, "scene_name": "still.blend", "frames": "1"}),
        );
        let job = wait_done(farm, id);
        assert_eq!(job["outputs"][0]["ext"], "exr", "{job}");
        let raw = get(&format!("{api}/jobs/{id}/frames/1"), &farm.alice);
        assert_eq!(raw.header("content-type"), Some("image/x-exr"));
        let thumb = get(&format!("{api}/jobs/{id}/frames/1?thumb=256"), &farm.alice);
        let (tw, _, mean) = png_size_and_brightness(&thumb.body);
        assert_eq!(tw, 64);
        assert!(mean > 5.0, "the EXR thumbnail is black (mean {mean})");

        // Errors: no token, another user's job, a bad digest, a body too large.
        let r = request("GET", &format!("{api}/jobs"), None, &[], &[]);
        assert_eq!(r.status, 401);
        assert!(r.json()["hint"].as_str().unwrap().contains("Bearer"));
        for path in [format!("jobs/{id}"), format!("jobs/{id}/frames/1")] {
            assert_eq!(
                get(&format!("{api}/{path}"), &farm.bob).status,
                404,
                "{path}"
            );
        }
        let r = post(&format!("{api}/jobs/{id}/cancel"), &farm.bob, &json!({}));
        assert_eq!(r.status, 404);
        let r = request(
            "PUT",
            &format!("{api}/blobs/not-a-digest"),
            Some(&farm.alice),
            &[],
            b"x",
        );
        assert_eq!(r.status, 400);
        assert!(r.json()["error"].as_str().unwrap().contains("digest"));
        let wrong = digest(b"something else");
        let r = request(
            "PUT",
            &format!("{api}/blobs/{wrong}"),
            Some(&farm.alice),
            &[],
            b"these bytes",
        );
        assert_eq!(r.status, 400, "{}", r.json());
        let huge = (9u64 << 20).to_string();
        let r = request(
            "PUT",
            &format!("{api}/blobs/{wrong}"),
            Some(&farm.alice),
            &[("Content-Length", &huge)],
            &[],
        );
        assert_eq!(r.status, 413, "{}", r.json());
        assert!(r.json()["hint"]
            .as_str()
            .unwrap()
            .contains("--max-upload-mib"));
        let big_json = format!("{{\"digests\": [\"{}\"]}}", "a".repeat(5 << 20));
        let r = request(
            "POST",
            &format!("{api}/blobs/missing"),
            Some(&farm.alice),
            &[],
            big_json.as_bytes(),
        );
        assert_eq!(r.status, 413);
    });
}

/// Waits for job `id` (as the admin) to be done; its JSON.
fn wait_done(farm: &Farm, id: u64) -> Value {
    let url = format!("{}/api/v1/jobs/{id}", farm.base);
    let deadline = Instant::now() + LONG;
    loop {
        let job = get(&url, &farm.admin).json();
        match job["state"].as_str() {
            Some("done") => return job,
            Some("failed") | Some("canceled") => panic!("job {id} ended: {job}"),
            _ if Instant::now() > deadline => panic!("job {id} did not finish: {job}"),
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// Where screenshots go: `$TESSERA_SCREENSHOTS` (the README's are made with
/// `TESSERA_SCREENSHOTS=docs`), else a scratch folder.
fn screenshots(scratch: &Path) -> PathBuf {
    match std::env::var_os("TESSERA_SCREENSHOTS") {
        Some(d) => {
            let d = root().join(d);
            std::fs::create_dir_all(&d).unwrap();
            d
        }
        None => scratch.to_path_buf(),
    }
}

#[test]
fn the_dashboard_signs_in_shows_a_job_finish_live_and_cancels_another() {
    let Some(binary) = chromium() else {
        eprintln!("SKIPPED: chromium is not installed (scripts/test.sh installs it; or set TESSERA_CHROMIUM)");
        return;
    };
    with_farm(|farm| {
        let scene = scene(&["--kind", "anim", "--frames", "2"]);
        let d = upload(farm, &farm.alice, &scene);
        // Bob's job, which Alice must not see.
        let bobs = upload(farm, &farm.bob, &scene);
        let bob_job = submit(
            farm,
            &farm.bob,
            json!({"scene_digest": bobs, "frames": "1", "device": "optix"}),
        );
        // A job that cannot run (no OptiX worker): it waits to be cancelled.
        let stuck = submit(
            farm,
            &farm.alice,
            json!({"scene_digest": d, "scene_name": "stuck.blend", "frames": "1-50", "device": "optix"}),
        );
        let shots = screenshots(farm.dir.path());
        let mut b = Browser::start(&binary, farm.dir.path(), 1280, 900);

        // Sign in with Alice's token.
        b.sign_in(&format!("{}/jobs/{stuck}", farm.base), &farm.alice);
        assert!(
            b.wait_for("location.pathname === '/' && document.querySelector('#jobs') && document.getElementById('live').className === 'on'", Duration::from_secs(20)),
            "the jobs page did not open after sign-in: {}",
            b.eval("document.body.innerText")
        );
        // The session cookie is out of the page's reach.
        assert_eq!(
            b.eval("document.cookie.includes('tessera_session')"),
            json!(false)
        );

        // Submit a tiled job now: the open page must show it arrive and end
        // without a reload.
        let id = submit(
            farm,
            &farm.alice,
            json!({
                "scene_digest": d, "scene_name": "tiled.blend", "frames": "1-2", "tiles": "2x2",
                "scene_info": {"width": 64, "height": 48, "file_format": "PNG"},
            }),
        );
        b.eval("window.__marker = 'same page'; true");
        let row = format!("document.querySelector('tr[data-job=\"{id}\"]')");
        assert!(
            b.wait_for(&row, Duration::from_secs(20)),
            "job {id} never appeared"
        );
        assert!(
            b.wait_for(&format!("{row}.dataset.state === 'done'"), LONG),
            "job {id} never showed done: {}",
            b.eval(&format!("{row} && {row}.innerText"))
        );
        assert_eq!(
            b.eval("window.__marker"),
            json!("same page"),
            "the page reloaded"
        );
        assert_eq!(
            b.eval(&format!("{row}.querySelector('.count').textContent")),
            json!("2/2")
        );
        // Alice's jobs, and not Bob's.
        let hers = get(&format!("{}/api/v1/jobs", farm.base), &farm.alice).json()["jobs"]
            .as_array()
            .unwrap()
            .len();
        assert!(hers >= 2);
        assert_eq!(
            b.eval("document.querySelectorAll('tr[data-job]').length"),
            json!(hers)
        );
        assert_eq!(
            b.eval(&format!(
                "!!document.querySelector('tr[data-job=\"{bob_job}\"]')"
            )),
            json!(false)
        );
        b.screenshot(&shots.join("dashboard-jobs.png"));

        // The job page: frames done, the last frame large, thumbnails loaded.
        b.goto(&format!("{}/jobs/{id}", farm.base));
        assert!(
            b.wait_for("document.querySelectorAll('#frames .cell.done').length === 2 && document.querySelector('#tiles')", Duration::from_secs(20)),
            "{}",
            b.eval("document.body.innerText")
        );
        assert!(
            b.wait_for("[...document.querySelectorAll('img.thumb')].filter(i => i.complete && i.naturalWidth > 0).length === 2 && document.getElementById('last-frame').naturalWidth === 64", Duration::from_secs(20)),
            "thumbnails did not load"
        );
        assert_eq!(
            b.eval("document.querySelectorAll('#tiles .cell.done').length"),
            json!(4)
        );
        // A finished job offers no pause or cancel; only a preview video.
        assert_eq!(
            b.eval("document.querySelectorAll('button[data-action]:not([data-action=preview])').length"),
            json!(0)
        );
        assert_eq!(
            b.eval("document.querySelector('button[data-action=preview]').textContent"),
            json!("Make preview video")
        );
        b.screenshot(&shots.join("dashboard-job.png"));

        // Cancel the waiting job with its button, and see it cancelled.
        b.goto(&format!("{}/jobs/{stuck}", farm.base));
        assert!(b.wait_for(
            "document.querySelector('button[data-action=cancel]')",
            Duration::from_secs(20)
        ));
        assert!(b
            .eval("document.body.innerText")
            .as_str()
            .unwrap()
            .contains("waiting: no available worker"));
        b.eval("document.querySelector('button[data-action=cancel]').click(); true");
        assert!(
            b.wait_for(
                "document.getElementById('job-state').textContent === 'canceled'",
                Duration::from_secs(20)
            ),
            "{}",
            b.eval("document.body.innerText")
        );
        assert_eq!(
            get(&format!("{}/api/v1/jobs/{stuck}", farm.base), &farm.alice).json()["state"],
            "canceled"
        );
        assert!(b.wait_for(
            "document.querySelector('button[data-action=retry]')",
            Duration::from_secs(5)
        ));

        // Workers: the one worker, online, with its slot.
        b.goto(&format!("{}/workers", farm.base));
        assert!(
            b.wait_for(
                "document.querySelector('[data-worker] .state.online')",
                Duration::from_secs(20)
            ),
            "{}",
            b.eval("document.body.innerText")
        );
        assert!(b
            .eval("document.querySelector('[data-worker]').innerText")
            .as_str()
            .unwrap()
            .contains("w1"));
        b.screenshot(&shots.join("dashboard-workers.png"));

        // At a phone's width nothing spills sideways.
        b.viewport(390, 800);
        b.goto(&format!("{}/", farm.base));
        assert!(b.wait_for(
            "document.querySelector('tr[data-job]')",
            Duration::from_secs(20)
        ));
        assert_eq!(
            b.eval("document.documentElement.scrollWidth <= window.innerWidth"),
            json!(true)
        );
    });
}
