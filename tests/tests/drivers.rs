//! Scenes whose drivers need auto-run Python: rendered as plain `blender -b`
//! renders them (the driver skipped) with a warning on the job, or, when the
//! job asks for the scene's Python, only on workers whose admin allows it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

/// The driver `tests/blender/make_scene.py --py-driver` adds.
const EXPR: &str = "bpy.context.scene.frame_current * 0.5 + 0.75";

fn py_driver_scene() -> std::path::PathBuf {
    scene(&["--kind", "still", "--py-driver", "--frames", "2"])
}

/// `blender -b -y SCENE -o DIR/ref_#### -s 1 -e 1 -a`: a direct render with
/// the scene's Python run.
fn reference_with_python(scene: &Path, dir: &Path) {
    let out = Command::new(blender())
        .arg("-b")
        .arg("-y")
        .arg(scene)
        .arg("-o")
        .arg(dir.join("ref_####"))
        .args(["-s", "1", "-e", "1", "-a"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reference render failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_driver_that_needs_auto_run_renders_as_plain_blender_does_with_a_warning() {
    let scene = py_driver_scene();
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let _w = worker(&coord.url, dir.path(), "a");
    let out = dir.path().join("out");
    submit_wait(&coord.url, &scene, "1-2", &out);
    let refs = dir.path().join("refs");
    reference(&scene, 1, 2, &refs);
    assert_matches_reference(&out, &refs, 1..=2);

    let job = status(&coord.url, 1);
    assert_eq!(job["state"], "done", "{job:#}");
    let warnings: Vec<&str> = job["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning for one driver: {warnings:?}"
    );
    let w = warnings[0];
    assert!(
        w.contains(EXPR)
            && w.contains("Object \"Cube\" location[2]")
            && w.contains("frames equal Blender's without `-y`")
            && w.contains("--scene-python"),
        "{w}"
    );
    // No failed attempt: the driver is not an error.
    assert_eq!(job["tasks"][0]["attempts"], 0, "{job:#}");
    let human = cli_ok(&coord.url, &["status", "1"]);
    assert!(human.contains("warning") && human.contains(EXPR), "{human}");
}

#[test]
fn a_job_with_scene_python_waits_for_a_worker_that_allows_it_and_runs_the_driver() {
    let scene = py_driver_scene();
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let _plain = worker(&coord.url, dir.path(), "plain");
    let job = submit(&coord.url, &scene, &["--frames", "1", "--scene-python"]);
    let waiting = wait_for(
        &coord.url,
        job,
        Duration::from_secs(60),
        "the reason it waits",
        |j| {
            j["waiting"]
                .as_str()
                .unwrap_or("")
                .contains("--allow-scene-python")
        },
    );
    assert_eq!(waiting["state"], "queued", "{waiting:#}");
    assert_eq!(waiting["features"], serde_json::json!(["scene-python"]));
    let _trusted = worker_with(
        &coord.url,
        dir.path(),
        "trusted",
        &["--slots", "1", "--device", "cpu", "--allow-scene-python"],
    );
    let done = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(
        done["warnings"],
        serde_json::json!([]),
        "the driver ran: {done:#}"
    );
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
    // The frame is Blender's with -y, and not Blender's without it: the
    // worker that allows stored Python rendered it, with auto-run on.
    let with_python = dir.path().join("refs-y");
    reference_with_python(&scene, &with_python);
    assert_matches_reference(&out, &with_python, 1..=1);
    let without = dir.path().join("refs-n");
    reference(&scene, 1, 1, &without);
    assert_ne!(
        png_pixels(&out.join("frame_0001.png")).3,
        png_pixels(&without.join("ref_0001.png")).3,
        "the driver moves the cube only with auto-run"
    );
}

#[test]
fn tessera_render_with_scene_python_runs_the_driver_in_a_spare_started_for_it() {
    // The user's own machine: `tessera render --scene-python` runs the
    // scene's Python as `blender -b -y` would, and its worker's spare
    // Blender is started that way from the first, so the task takes it.
    let scene = py_driver_scene();
    let dir = scratch();
    let out = dir.path().join("out");
    let run = Command::new(tessera())
        .args(["render", scene.to_str().unwrap(), "--frames", "1"])
        .args(["--scene-python", "--workers", "1", "-o"])
        .arg(&out)
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_COORDINATOR")
        .env("XDG_CONFIG_HOME", dir.path())
        .env("RUST_LOG", "tessera_worker=info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{log}");
    assert!(log.contains("spare=true"), "{log}");
    assert!(!log.contains("asks for another Blender"), "{log}");
    let with_python = dir.path().join("refs-y");
    reference_with_python(&scene, &with_python);
    assert_matches_reference(&out, &with_python, 1..=1);
}
