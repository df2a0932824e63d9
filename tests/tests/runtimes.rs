//! Blender runtimes end to end: a farm with Debian's Blender 3.4 on one
//! worker and the official Blender 4.5 (the `bpy` module from PyPI) on
//! another. Each job goes to a Blender that reads its scene, and every frame
//! equals a direct render with that same Blender.
//!
//! One coordinator and its two workers serve the whole file (killed when the
//! test process exits). No Blender of theirs has a display: workers pass
//! Blender no `DISPLAY`, so EEVEE runs as on a headless render node. The `bpy` runtime is the one `scripts/test.sh`
//! installs (`tessera blender install 4.5`); without it the tests skip and
//! say why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;
use tessera_tests::*;

/// The farm every test here shares.
struct Farm {
    dir: tempfile::TempDir,
    coord: Coordinator,
    /// The `bpy` runtime's Python.
    python: PathBuf,
    _workers: Vec<Proc>,
    _reaper: std::process::Child,
}

/// The shared farm, or None (said why) without a `bpy` runtime.
fn farm() -> Option<&'static Farm> {
    static FARM: OnceLock<Option<Farm>> = OnceLock::new();
    FARM.get_or_init(|| {
        let python = bpy_python()?;
        let dir = scratch();
        let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
        let runtimes = runtimes_dir();
        // Neither worker has a display: EEVEE must work headless.
        let old = worker_env(
            &coord.url,
            dir.path(),
            "old",
            &["--blender", "blender"],
            &[("TESSERA_TOKEN", &worker_token(&coord.url))],
        );
        let new = worker_env(
            &coord.url,
            dir.path(),
            "new",
            &["--blender", "4.5", "--runtimes", runtimes.to_str().unwrap()],
            &[("TESSERA_TOKEN", &worker_token(&coord.url))],
        );
        let reaper = reap_at_exit(&[coord.proc.child.id(), old.child.id(), new.child.id()]);
        let ready = eventually(std::time::Duration::from_secs(300), || {
            workers_by_name(&coord.url).len() == 2
        });
        assert!(
            ready,
            "workers did not register:\n{}\n{}",
            old.log(),
            new.log()
        );
        Some(Farm {
            dir,
            coord,
            python,
            _workers: vec![old, new],
            _reaper: reaper,
        })
    })
    .as_ref()
}

/// The names of the workers whose attempts at job `job`'s tasks are done.
fn rendered_by(f: &Farm, job: u64) -> Vec<String> {
    let names: std::collections::HashMap<String, String> = workers_by_name(&f.coord.url)
        .into_iter()
        .map(|(name, w)| (w["id"].as_str().unwrap().to_string(), name))
        .collect();
    let mut by: Vec<String> = status(&f.coord.url, job)["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["attempt_log"].as_array().unwrap().clone())
        .filter(|a| a["end"] == "done")
        .map(|a| names[a["worker"].as_str().unwrap()].clone())
        .collect();
    assert!(!by.is_empty(), "job {job} has no done attempt");
    by.sort();
    by.dedup();
    by
}

/// Submits `scene` (with `args`), waits, fetches, and returns the job id and
/// the folder of its frames.
fn render(f: &Farm, scene: &Path, frames: &str, args: &[&str]) -> (u64, PathBuf) {
    let mut all = vec!["--frames", frames];
    all.extend_from_slice(args);
    let job = submit(&f.coord.url, scene, &all);
    let out = f.dir.path().join(format!("out-{job}"));
    let waited = cli(&f.coord.url, &["watch", &job.to_string()]);
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let s = status(&f.coord.url, job);
    assert_eq!(s["state"], "done", "job {job}: {s:#}");
    cli_ok(
        &f.coord.url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
    (job, out)
}

/// Asserts that job `job`'s frames in `out` equal a direct render of
/// `scene` with the same Blender: Debian's (`python` None) or the `bpy`
/// module at `python`.
fn exact(f: &Farm, job: u64, out: &Path, scene: &Path, python: Option<&Path>) {
    let refs = f.dir.path().join(format!("refs-{job}"));
    match python {
        Some(p) => bpy_reference(p, scene, 1, 2, &refs),
        None => reference(scene, 1, 2, &refs),
    }
    assert_matches_reference(out, &refs, 1..=2);
}

#[test]
fn each_worker_reports_each_runtime_with_what_it_renders() {
    let Some(f) = farm() else { return };
    let workers = workers_by_name(&f.coord.url);
    let runtimes =
        |name: &str| -> Vec<Value> { workers[name]["runtimes"].as_array().unwrap().clone() };
    let old = runtimes("old");
    assert_eq!(old.len(), 1, "{old:?}");
    assert_eq!(old[0]["version"], "3.4.1");
    assert_eq!(old[0]["kind"], "blender");
    let new = runtimes("new");
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(
        new[0]["version"].as_str().unwrap().starts_with("4.5."),
        "{new:?}"
    );
    assert_eq!(new[0]["kind"], "bpy");
    let features = |r: &Value| -> Vec<String> {
        r["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    // Debian's 3.4 has no OpenImageDenoise; the official 4.5 has it and OSL.
    assert!(!features(&old[0]).contains(&"openimagedenoise".to_string()));
    assert!(features(&new[0]).contains(&"openimagedenoise".to_string()));
    assert!(features(&new[0]).contains(&"osl".to_string()));
    // Both render EEVEE here, with no display: learned by rendering a frame.
    assert!(features(&old[0]).contains(&"eevee".to_string()), "{old:?}");
    assert!(features(&new[0]).contains(&"eevee".to_string()), "{new:?}");
    let table = cli_ok(&f.coord.url, &["workers"]);
    assert!(
        table.contains("3.4.1") && table.contains("4.5.") && table.contains("bpy"),
        "{table}"
    );
}

#[test]
fn a_scene_saved_by_4_5_renders_on_4_5_and_a_3_4_scene_where_it_is_asked_to() {
    let Some(f) = farm() else { return };
    let s45 = f.dir.path().join("s45/scene.blend");
    bpy_scene(&f.python, &s45, &["--frames", "2"]);
    let (job, out) = render(f, &s45, "1-2", &[]);
    assert_eq!(status(&f.coord.url, job)["blender"], "^4.5");
    assert_eq!(rendered_by(f, job), ["new"]);
    exact(f, job, &out, &s45, Some(&f.python));
    // In tiles, with the overscan the scene asks for (none: each pixel
    // renders on its own), stitched to exactly the frames 4.5 renders.
    let (job, out) = render(f, &s45, "1-2", &["--tiles", "2x2"]);
    let s = status(&f.coord.url, job);
    assert_eq!(
        (&s["tiles"], &s["overscan"]),
        (&"2x2".into(), &0.into()),
        "{s:#}"
    );
    assert_eq!(rendered_by(f, job), ["new"]);
    exact(f, job, &out, &s45, Some(&f.python));

    // A 3.4 scene goes to 3.4 unless asked otherwise; asked for 4.5, it is
    // rendered by 4.5 exactly as 4.5 renders it directly.
    let s34 = scene(&["--frames", "2"]);
    let (job, out) = render(f, &s34, "1-2", &[]);
    assert_eq!(rendered_by(f, job), ["old"]);
    exact(f, job, &out, &s34, None);
    let (job, out) = render(f, &s34, "1-2", &["--blender", "4.5"]);
    assert_eq!(status(&f.coord.url, job)["blender"], "4.5");
    assert_eq!(rendered_by(f, job), ["new"]);
    exact(f, job, &out, &s34, Some(&f.python));
}

#[test]
fn tessera_render_starts_its_spare_blender_with_the_runtime_that_reads_the_scene() {
    // No farm of this file's: `tessera render`'s own, on this machine's
    // Blenders (Debian's 3.4, listed first, and 4.5).
    let Some(python) = bpy_python() else { return };
    let dir = scratch();
    let s45 = dir.path().join("s45/scene.blend");
    bpy_scene(&python, &s45, &["--frames", "2"]);
    let out = dir.path().join("out");
    let run = Command::new(tessera())
        .args(["render", s45.to_str().unwrap(), "--frames", "1-2"])
        .args(["--workers", "1", "-o", out.to_str().unwrap()])
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_COORDINATOR")
        .env("XDG_CONFIG_HOME", dir.path())
        .env("TESSERA_RUNTIMES", runtimes_dir())
        .env("RUST_LOG", "tessera_worker=info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{log}");
    // The slot's spare was a 4.5 from the start: it took the scene, and no
    // Blender was started only to be ended for another.
    assert_eq!(log.matches("Blender session started").count(), 1, "{log}");
    assert!(log.contains("spare=true"), "{log}");
    assert!(!log.contains("asks for another Blender"), "{log}");
    let refs = dir.path().join("refs");
    bpy_reference(&python, &s45, 1, 2, &refs);
    assert_matches_reference(&out, &refs, 1..=2);
}

#[test]
fn a_scene_saved_by_a_newer_blender_than_any_here_is_refused_naming_the_versions() {
    let Some(f) = farm() else { return };
    // A 5.0 header (5.0's new format) in front of a scene's bytes: what
    // matters at submit is the version the header names.
    let s45 = f.dir.path().join("s50/base.blend");
    bpy_scene(&f.python, &s45, &["--frames", "1"]);
    let mut bytes = b"BLENDER17-01v0500".to_vec();
    bytes.extend_from_slice(&std::fs::read(&s45).unwrap()[12..]);
    // 5.0's end block header is 8 bytes longer than 4.5's.
    bytes.extend_from_slice(&[0; 8]);
    let s50 = f.dir.path().join("s50/scene.blend");
    std::fs::write(&s50, bytes).unwrap();
    let out = cli(
        &f.coord.url,
        &["submit", s50.to_str().unwrap(), "--frames", "1"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("Blender 5.0")
            && err.contains("3.4.1")
            && err.contains("4.5.")
            && err.contains("tessera blender install 5.0"),
        "{err}"
    );
}

#[test]
fn a_denoised_scene_renders_denoised_equal_to_a_direct_render() {
    let Some(f) = farm() else { return };
    let s = f.dir.path().join("denoise/scene.blend");
    bpy_scene(
        &f.python,
        &s,
        &[
            "--frames",
            "2",
            "--denoise",
            "--samples",
            "4",
            "--width",
            "96",
            "--height",
            "72",
        ],
    );
    let (job, out) = render(f, &s, "1-2", &[]);
    let st = status(&f.coord.url, job);
    assert!(
        st["features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "openimagedenoise"),
        "{st:#}"
    );
    assert_eq!(rendered_by(f, job), ["new"]);
    exact(f, job, &out, &s, Some(&f.python));
}

#[test]
fn an_eevee_scene_with_textures_in_a_folder_with_spaces_renders_without_a_display() {
    let Some(f) = farm() else { return };
    let dir = f.dir.path().join("eevee project/my shot");
    let s = dir.join("shot.blend");
    let texture = dir.join("tex dir/checker board.png");
    make_scene(
        &s,
        &[
            "--frames",
            "2",
            "--eevee",
            "--samples",
            "4",
            "--texture",
            texture.to_str().unwrap(),
        ],
    );
    let (job, out) = render(f, &s, "1-2", &[]);
    let st = status(&f.coord.url, job);
    assert!(
        st["features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "eevee"),
        "{st:#}"
    );
    // Saved by 3.4: rendered by 3.4, whose EEVEE falls back to surfaceless EGL.
    assert_eq!(rendered_by(f, job), ["old"]);
    exact(f, job, &out, &s, None);
}

#[test]
fn installing_a_line_without_its_python_names_the_fix() {
    // Blender 5.1's wheels are built for Python 3.13, which this machine's
    // PATH (reduced to the system folders) does not have.
    let dir = scratch();
    let out = Command::new(tessera())
        .args(["blender", "install", "5.1", "--runtimes"])
        .arg(dir.path())
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if std::path::Path::new("/usr/bin/python3.13").exists() {
        eprintln!("skipped: this machine has /usr/bin/python3.13");
        return;
    }
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("needs Python 3.13") && err.contains("apt-get install python3.13"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing is left behind"
    );
}
