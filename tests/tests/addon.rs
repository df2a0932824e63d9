//! The Blender add-on end to end: `scripts/addon.sh` builds the zip, a
//! headless Blender installs it into a temporary `BLENDER_USER_SCRIPTS`,
//! enables it, sets its preferences and runs its operators
//! (`tests/addon/drive.py`) against a real coordinator's HTTP API
//! (`tessera coordinator --http`) and a real worker.
//!
//! One coordinator and worker serve the whole file (they are killed when the
//! test process exits).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};
use tessera_tests::*;

/// The farm every test here shares.
struct Farm {
    dir: tempfile::TempDir,
    coord: Coordinator,
    worker: Proc,
    /// `http://127.0.0.1:PORT`: the coordinator's HTTP API.
    http: String,
    /// A token with the `user` role.
    user_token: String,
    /// Kills the farm when the test process ends.
    _reaper: std::process::Child,
}

fn farm() -> &'static Farm {
    static FARM: OnceLock<Farm> = OnceLock::new();
    FARM.get_or_init(|| {
        let dir = scratch();
        let coord = Coordinator::start(
            &dir.path().join("data"),
            "127.0.0.1:0",
            &["--http", "127.0.0.1:0"],
        );
        let worker = worker(&coord.url, dir.path(), "a");
        let reaper = reap_at_exit(&[coord.proc.child.id(), worker.child.id()]);
        let http = coord
            .metrics
            .clone()
            .expect("started with --http")
            .trim_end_matches("/metrics")
            .to_string();
        let user_token = cli_ok(&coord.url, &["users", "add", "artist"])
            .trim()
            .to_string();
        Farm {
            dir,
            coord,
            worker,
            http,
            user_token,
            _reaper: reaper,
        }
    })
}

/// `out/tessera-addon.zip`, built once per test process.
fn addon_zip() -> PathBuf {
    static ZIP: OnceLock<PathBuf> = OnceLock::new();
    ZIP.get_or_init(|| {
        let out = Command::new("bash")
            .arg(root().join("scripts/addon.sh"))
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "scripts/addon.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let zip = root().join("out/tessera-addon.zip");
        assert!(zip.is_file());
        zip
    })
    .clone()
}

/// Runs `steps` in a headless Blender with the add-on installed afresh in a
/// temporary user-scripts folder; returns drive.py's result and Blender's output.
fn drive(scene: &Path, prefs: Value, steps: Value) -> (Value, String) {
    let tmp = scratch();
    let result = tmp.path().join("result.json");
    let out = Command::new(blender())
        .arg("-b")
        .arg(scene)
        .args(["--python-exit-code", "3", "--python"])
        .arg(root().join("tests/addon/drive.py"))
        .arg("--")
        .arg("--zip")
        .arg(addon_zip())
        .args(["--prefs", &prefs.to_string(), "--steps", &steps.to_string()])
        .arg("--out")
        .arg(&result)
        .env("BLENDER_USER_SCRIPTS", tmp.path().join("scripts"))
        .env("BLENDER_USER_CONFIG", tmp.path().join("config"))
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .output()
        .expect("blender runs");
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "drive.py failed:\n{log}");
    let v: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    for step in v["steps"].as_array().unwrap() {
        assert_eq!(
            step["traceback"], false,
            "a traceback reached the artist:\n{log}"
        );
    }
    (v, log)
}

fn prefs(url: &str, token: &str) -> Value {
    json!({"url": url, "token": token, "tessera_path": tessera()})
}

fn step<'a>(v: &'a Value, op: &str) -> &'a Value {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["op"] == op)
        .unwrap_or_else(|| panic!("no step {op} in {v}"))
}

#[test]
fn submit_then_fetch_a_scene_with_a_texture_and_a_library_equals_a_direct_render() {
    let f = farm();
    let dir = scratch();
    let scene = asset_scene(dir.path(), "library");
    let frames = dir.path().join("frames");
    let (v, log) = drive(
        &scene,
        prefs(&f.http, &f.user_token),
        json!([["test_connection", {}], ["submit", {}],
               ["fetch", {"wait": true, "timeout": 300.0, "directory": frames}]]),
    );
    for op in ["test_connection", "submit", "fetch"] {
        assert_eq!(step(&v, op)["result"], json!(["FINISHED"]), "{op}:\n{log}");
    }
    assert!(step(&v, "submit")["job_id"].as_u64().unwrap() > 0);
    assert_eq!(
        v["blend_sha_before"], v["blend_sha_after"],
        "the artist's .blend changed"
    );
    let refs = dir.path().join("ref");
    reference(&scene, 1, 1, &refs);
    assert_same_pixels(&refs.join("ref_0001.png"), &frames.join("frame_0001.png"));
}

#[test]
fn an_unreachable_coordinator_and_a_missing_texture_are_reported_in_words() {
    let dir = scratch();
    let scene = asset_scene(dir.path(), "missing");
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let (v, log) = drive(
        &scene,
        prefs(&url, "some-token"),
        json!([["test_connection", {}], ["submit", {}]]),
    );
    let e = step(&v, "test_connection")["error"].as_str().unwrap();
    assert!(e.contains("cannot reach the coordinator at"), "{e}\n{log}");
    // The missing file is refused before any network use, naming the file.
    let e = step(&v, "submit")["error"].as_str().unwrap();
    assert!(
        e.contains("do not exist") && e.contains("not_there.png"),
        "{e}\n{log}"
    );
    assert_eq!(v["blend_sha_before"], v["blend_sha_after"]);
    // A scene without a missing file reaches the network and says why it failed.
    let scene = asset_scene(dir.path(), "library");
    let (v, log) = drive(&scene, prefs(&url, "some-token"), json!([["submit", {}]]));
    let e = step(&v, "submit")["error"].as_str().unwrap();
    assert!(e.contains("cannot reach the coordinator at"), "{e}\n{log}");
}

#[test]
fn a_wrong_token_is_reported_in_words() {
    let f = farm();
    let dir = scratch();
    let scene = asset_scene(dir.path(), "library");
    let (v, log) = drive(
        &scene,
        prefs(&f.http, "not-a-token"),
        json!([["test_connection", {}], ["submit", {}]]),
    );
    for op in ["test_connection", "submit"] {
        let e = step(&v, op)["error"].as_str().unwrap_or_default();
        assert!(e.contains("refused the token"), "{op}: {e}\n{log}");
    }
}

#[test]
fn an_exported_bundle_submitted_with_tessera_submit_bundle_equals_a_direct_render() {
    let f = farm();
    let dir = scratch();
    let scene = asset_scene(dir.path(), "library");
    let bundle = dir.path().join("bundle");
    // The pure-Python BLAKE3 writes the manifest; `submit --bundle` checks
    // every digest again with the native one.
    let mut p = prefs("http://127.0.0.1:9", "unused");
    p["hasher"] = json!("PYTHON");
    let (v, log) = drive(&scene, p, json!([["export_bundle", {"directory": bundle}]]));
    assert_eq!(
        step(&v, "export_bundle")["result"],
        json!(["FINISHED"]),
        "{log}"
    );
    assert_eq!(v["blend_sha_before"], v["blend_sha_after"]);
    // The add-on's file set follows `tessera deps`: same paths, same digests
    // (but the scene's, which is a fresh save of the open file).
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("manifest.json")).unwrap()).unwrap();
    let deps: Value = serde_json::from_str(&cli_ok(
        &f.coord.url,
        &["deps", scene.to_str().unwrap(), "--json"],
    ))
    .unwrap();
    let listed = |files: &Value| -> Vec<(String, String)> {
        files
            .as_array()
            .unwrap()
            .iter()
            .skip(1)
            .map(|e| {
                (
                    e["path"].as_str().unwrap().into(),
                    e["digest"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    assert_eq!(manifest["file_set"]["scene"], deps["scene"]);
    assert_eq!(
        listed(&manifest["file_set"]["files"]),
        listed(&deps["files"])
    );
    assert_eq!(manifest["file_set"]["mappings"], deps["mappings"]);
    // Moved to "another machine": the original tree is gone.
    std::fs::rename(dir.path().join("library"), dir.path().join("gone")).unwrap();
    let frames = dir.path().join("frames");
    let out = cli_ok(
        &f.coord.url,
        &[
            "submit",
            "--bundle",
            bundle.to_str().unwrap(),
            "-o",
            frames.to_str().unwrap(),
        ],
    );
    assert!(out.trim().parse::<u64>().is_ok(), "{out}");
    std::fs::rename(dir.path().join("gone"), dir.path().join("library")).unwrap();
    let refs = dir.path().join("ref");
    reference(&scene, 1, 1, &refs);
    assert_same_pixels(&refs.join("ref_0001.png"), &frames.join("frame_0001.png"));
    // A file changed after export is refused.
    std::fs::write(bundle.join("files/shots/tex/grey.png"), b"not a png").unwrap();
    let o = cli(
        &f.coord.url,
        &["submit", "--bundle", bundle.to_str().unwrap()],
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("does not match its manifest"),
        "{e}"
    );
    let _ = (&f.dir, &f.worker);
}

#[test]
fn an_upload_cancelled_midway_leaves_no_job_behind() {
    let f = farm();
    let dir = scratch();
    let scene = asset_scene(dir.path(), "library");
    let jobs = |f: &Farm| -> usize {
        let out = cli_as(&f.coord.url, Some(&f.user_token), &["jobs", "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .len()
    };
    let before = jobs(f);
    let (v, log) = drive(
        &scene,
        prefs(&f.http, &f.user_token),
        json!([["upload_cancelled_midway", {}]]),
    );
    let s = step(&v, "upload_cancelled_midway");
    assert_eq!(s["stage"], "cancelled", "{s}\n{log}");
    assert!(s["job_id"].is_null(), "{s}");
    assert!(s["error"].is_null(), "{s}");
    assert_eq!(jobs(f), before, "no job was submitted");
}
