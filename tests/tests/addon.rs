//! The Blender add-on end to end: `scripts/addon.sh` builds the zip, a
//! headless Blender installs it into temporary user folders, enables it,
//! sets its preferences and runs its operators (`tests/addon/drive.py`)
//! against a real coordinator's HTTP API (`tessera coordinator --http`) and
//! real workers.
//!
//! Two Blenders run the add-on: Debian's 3.4 binary (`blender`, a legacy
//! add-on read from `bl_info`) and an official `bpy` module, 4.2 or later
//! (an extension read from `blender_manifest.toml`, module
//! `bl_ext.user_default.tessera`), found at `$TESSERA_BPY` (a venv) or
//! `~/.cache/tessera/runtimes/bpy-4.5.15`; the `bpy` cases say why they skip
//! when it is absent.
//!
//! One coordinator serves the whole file, with a 3.4 worker and, when the
//! `bpy` runtime is there, a worker with that Blender; they are killed when the test
//! process exits. Blender 3.4 crashes on files saved by 4.x, and the add-on
//! always sends a copy saved by the Blender it runs in, so each job carries
//! a tag only the worker with the same Blender has.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};
use tessera_tests::*;

/// The tag of the worker whose Blender is Debian's 3.4.
const TAG_34: &str = "blender-3.4";
/// The tag of the worker whose Blender is the `bpy` module.
const TAG_BPY: &str = "blender-bpy";

/// The farm every test here shares.
struct Farm {
    dir: tempfile::TempDir,
    coord: Coordinator,
    worker: Proc,
    /// The worker whose Blender is the `bpy` module, when there is one.
    worker_45: Option<Proc>,
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
        let worker = worker_with(
            &coord.url,
            dir.path(),
            "a",
            &["--slots", "1", "--device", "cpu", "--tag", TAG_34],
        );
        // A worker whose one Blender is the bpy runtime (a venv).
        let worker_45 = bpy_runtime().map(|venv| {
            worker_with(
                &coord.url,
                dir.path(),
                "b45",
                &[
                    "--slots",
                    "1",
                    "--device",
                    "cpu",
                    "--tag",
                    TAG_BPY,
                    "--blender",
                    venv.to_str().unwrap(),
                ],
            )
        });
        let mut pids = vec![coord.proc.child.id(), worker.child.id()];
        pids.extend(worker_45.iter().map(|w| w.child.id()));
        let reaper = reap_at_exit(&pids);
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
            worker_45,
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

/// A Blender that runs the add-on.
enum Runtime {
    /// A `blender` binary (Debian's 3.4): `blender -b SCENE --python drive.py`.
    Binary(PathBuf),
    /// A `bpy` module venv (4.2+): `VENV/bin/python -I drive.py --scene SCENE`.
    Module(PathBuf),
}

impl Runtime {
    /// Debian's Blender, as every other test runs it.
    fn binary() -> Self {
        Runtime::Binary(blender())
    }

    /// Runs a Blender script with `args` after `--`, from a fresh factory
    /// state, as `blender -b --factory-startup --python SCRIPT -- ARGS` does.
    fn script(&self, script: &Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
        let mut cmd = match self {
            Runtime::Binary(blender) => {
                let mut c = Command::new(blender);
                c.args([
                    "-b",
                    "--factory-startup",
                    "--python-exit-code",
                    "2",
                    "--python",
                ])
                .arg(script);
                c
            }
            Runtime::Module(venv) => {
                let mut c = Command::new(venv.join("bin/python"));
                c.arg("-I").arg(script);
                c
            }
        };
        cmd.arg("--").args(args).output().expect("blender runs")
    }

    /// `make_asset_scenes.py`'s `case` under `dir`, saved by this Blender;
    /// returns the scene (as `asset_scene` does for the binary).
    fn asset_scene(&self, dir: &Path, case: &str) -> PathBuf {
        if let Runtime::Binary(_) = self {
            return asset_scene(dir, case);
        }
        let out = dir.join(case);
        let result = self.script(
            &root().join("tests/blender/make_asset_scenes.py"),
            &[
                "--dir".as_ref(),
                out.as_os_str(),
                "--case".as_ref(),
                case.as_ref(),
            ],
        );
        assert!(
            result.status.success(),
            "make_asset_scenes.py {case} failed in the bpy runtime:\n{}{}",
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
        let scene = out.join("shots/shot.blend");
        assert!(scene.is_file(), "{}", scene.display());
        scene
    }

    /// Renders frame 1 of `scene` directly with this Blender, no farm:
    /// `dir/ref_0001.png`.
    fn reference(&self, scene: &Path, dir: &Path) -> PathBuf {
        match self {
            Runtime::Binary(_) => reference(scene, 1, 1, dir),
            Runtime::Module(venv) => bpy_reference(&venv.join("bin/python"), scene, 1, 1, dir),
        }
        dir.join("ref_0001.png")
    }
}

/// The `bpy` runtime: `$TESSERA_BPY` (a venv, which must hold bpy when
/// set), else the suite's 4.5 runtime ([`bpy_python`]).
fn bpy_runtime() -> Option<PathBuf> {
    if let Some(venv) = std::env::var_os("TESSERA_BPY") {
        let venv = PathBuf::from(venv);
        assert!(
            venv.join("bin/python").is_file(),
            "TESSERA_BPY={} has no bin/python: point it at a venv with bpy installed",
            venv.display()
        );
        return Some(venv);
    }
    let python = bpy_python()?;
    python.parent()?.parent().map(Path::to_path_buf)
}

/// The `bpy` runtime, or None after saying why `test` skips.
fn bpy_or_skip(test: &str) -> Option<Runtime> {
    let found = bpy_runtime().map(Runtime::Module);
    if found.is_none() {
        eprintln!(
            "skipped {test}: no bpy runtime (TESSERA_BPY is unset and none is installed); \
             install one with `tessera blender install 4.5`, or set TESSERA_BPY to a venv with bpy"
        );
    }
    found
}

/// Runs `steps` in a headless Blender with the add-on installed afresh in
/// temporary user folders; returns drive.py's result and Blender's output.
fn drive(scene: &Path, prefs: Value, steps: Value) -> (Value, String) {
    drive_in(&Runtime::binary(), scene, prefs, steps)
}

fn drive_in(runtime: &Runtime, scene: &Path, prefs: Value, steps: Value) -> (Value, String) {
    let tmp = scratch();
    let result = tmp.path().join("result.json");
    let mut cmd = match runtime {
        Runtime::Binary(blender) => {
            let mut c = Command::new(blender);
            c.arg("-b")
                .arg(scene)
                .args(["--python-exit-code", "3", "--python"])
                .arg(root().join("tests/addon/drive.py"))
                .arg("--");
            c
        }
        Runtime::Module(venv) => {
            let mut c = Command::new(venv.join("bin/python"));
            c.arg("-I")
                .arg(root().join("tests/addon/drive.py"))
                .arg("--scene")
                .arg(scene);
            c
        }
    };
    let out = cmd
        .arg("--zip")
        .arg(addon_zip())
        .args(["--prefs", &prefs.to_string(), "--steps", &steps.to_string()])
        .arg("--out")
        .arg(&result)
        // 3.4 reads the first two; 4.2 and later keep everything (extensions
        // included) under the last.
        .env("BLENDER_USER_SCRIPTS", tmp.path().join("scripts"))
        .env("BLENDER_USER_CONFIG", tmp.path().join("config"))
        .env("BLENDER_USER_RESOURCES", tmp.path().join("resources"))
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

/// Submits `case`'s scene from the add-on in `runtime`, to the worker
/// tagged `tag`, fetches its frame and compares it with a direct render by
/// the same Blender; returns drive.py's result.
fn submit_then_fetch(runtime: &Runtime, tag: &str) -> Value {
    let f = farm();
    let dir = scratch();
    let scene = runtime.asset_scene(dir.path(), "library");
    let frames = dir.path().join("frames");
    let (v, log) = drive_in(
        runtime,
        &scene,
        prefs(&f.http, &f.user_token),
        json!([["set", {"scene.tessera.tags": tag}],
               ["test_connection", {}], ["submit", {}],
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
    let reference = runtime.reference(&scene, &dir.path().join("ref"));
    assert_same_pixels(&reference, &frames.join("frame_0001.png"));
    v
}

#[test]
fn submit_then_fetch_in_blender_3_4_as_a_legacy_add_on_equals_a_direct_render() {
    let v = submit_then_fetch(&Runtime::binary(), TAG_34);
    assert_eq!(v["module"], "tessera");
    assert!(v["blender"].as_str().unwrap().starts_with("3.4"), "{v}");
}

/// 4.5 by default; `TESSERA_BPY` may name a 4.2 or 5.0 runtime instead.
#[test]
fn submit_then_fetch_in_the_bpy_module_as_an_extension_equals_a_direct_render() {
    let Some(runtime) =
        bpy_or_skip("submit_then_fetch_in_the_bpy_module_as_an_extension_equals_a_direct_render")
    else {
        return;
    };
    let v = submit_then_fetch(&runtime, TAG_BPY);
    // Installed from blender_manifest.toml, under the extension's module
    // name; its preferences are found by that name.
    assert_eq!(v["module"], "bl_ext.user_default.tessera");
    let version = v["blender"].as_str().unwrap();
    assert!(!version.starts_with("3."), "{version}");
}

#[test]
fn with_online_access_off_a_coordinator_on_the_internet_is_refused_in_words() {
    let Some(runtime) =
        bpy_or_skip("with_online_access_off_a_coordinator_on_the_internet_is_refused_in_words")
    else {
        return;
    };
    // The bpy module starts with online access off, as Blender 4.2+ does
    // until the artist allows it; the farm on this machine was reachable
    // all along (submit_then_fetch_in_the_bpy_module...). An address
    // literal: no DNS, and the refusal comes before any connection.
    let dir = scratch();
    let scene = runtime.asset_scene(dir.path(), "library");
    let (v, log) = drive_in(
        &runtime,
        &scene,
        prefs("http://1.1.1.1:7879", "some-token"),
        json!([["test_connection", {}]]),
    );
    let e = step(&v, "test_connection")["error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        e.contains("online access is off") && e.contains("Allow Online Access"),
        "{e}\n{log}"
    );
}

#[test]
fn the_extension_manifest_and_bl_info_name_the_same_version() {
    let dir = root().join("blender/addon/tessera");
    let manifest = std::fs::read_to_string(dir.join("blender_manifest.toml")).unwrap();
    let init = std::fs::read_to_string(dir.join("__init__.py")).unwrap();
    let line = |text: &str, key: &str| -> String {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} line"))
            .to_string()
    };
    let manifest_version = line(&manifest, "version = ").trim_matches('"').to_string();
    let bl_info_version: Vec<String> = line(&init, "\"version\": (")
        .trim_end_matches("),")
        .split(',')
        .map(|p| p.trim().to_string())
        .collect();
    assert_eq!(manifest_version, bl_info_version.join("."));
}

/// Issue 21 part 11: the token is kept in a file only its owner reads, not
/// in Blender's `userpref.blend` (which was mode 644).
#[test]
fn the_token_is_kept_in_a_file_only_its_owner_reads() {
    let dir = scratch();
    let scene = asset_scene(dir.path(), "library");
    let token = "tessera-test-token-3f9a1c";
    let (v, log) = drive(
        &scene,
        prefs("http://127.0.0.1:9", token),
        json!([["save_userpref", {}]]),
    );
    let s = step(&v, "save_userpref");
    assert_eq!(
        s["token_in_userpref"], false,
        "the token is in userpref.blend\n{log}"
    );
    assert_eq!(s["token_in_file"], true, "{s}\n{log}");
    assert_eq!(s["token_file_mode"], 0o600, "{s}");
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
            "--tag",
            TAG_34,
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
    let _ = (&f.dir, &f.worker, &f.worker_45);
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
