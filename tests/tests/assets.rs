//! File sets end to end: scenes that use external files (textures in
//! subfolders and by absolute path, linked libraries with their own
//! textures, image sequences, UDIM tiles, 2,000 small files) render on a real
//! farm pixel for pixel as Blender renders them from the original files;
//! missing files refuse the submit; unchanged files are not sent again.
//! Below the farm, `tests/blender/check_file_sets.py` checks the Blender
//! side of every case: what `deps.py` lists, `remap.py` at load and
//! `rewrite_library.py`'s copies.

use std::path::Path;

use tessera_tests::*;

struct Farm {
    dir: tempfile::TempDir,
    coord: Coordinator,
    _worker: Proc,
}

fn farm() -> Farm {
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let w = worker(&coord.url, dir.path(), "a");
    Farm {
        dir,
        coord,
        _worker: w,
    }
}

/// Submits and waits; returns stderr (which says what was uploaded).
fn render(f: &Farm, scene: &Path, frames: &str, out: &Path) -> String {
    let o = cli(
        &f.coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            frames,
            "-o",
            out.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "submit {} failed:\n{stderr}",
        scene.display()
    );
    stderr
}

#[test]
fn scenes_with_external_files_render_exactly_from_their_file_sets() {
    let f = farm();
    let src = f.dir.path().join("src");
    for (case, start, end) in [
        ("subfolder", 1, 1),
        ("absolute", 1, 1),
        ("library", 1, 1),
        ("linked-absolute", 1, 1),
        ("udim", 1, 1),
        ("sequence", 1, 3),
    ] {
        let scene = asset_scene(&src, case);
        let refs = f.dir.path().join(format!("ref-{case}"));
        reference(&scene, start, end, &refs);
        let out = f.dir.path().join(format!("out-{case}"));
        let stderr = render(&f, &scene, &format!("{start}-{end}"), &out);
        assert!(
            stderr.contains("file(s)"),
            "{case}: a file set travelled: {stderr}"
        );
        for frame in start..=end {
            assert_same_pixels(
                &out.join(format!("frame_{frame:04}.png")),
                &refs.join(format!("ref_{frame:04}.png")),
            );
        }
    }
    // Every job named a file set, and workers read nothing outside it: a
    // worker refuses scenes that refer to files outside the job.
    let jobs: serde_json::Value =
        serde_json::from_str(&cli_ok(&f.coord.url, &["jobs", "--json"])).unwrap();
    for j in jobs.as_array().unwrap() {
        assert_eq!(j["state"], "done", "{j:#}");
        assert_eq!(j["file_set_digest"].as_str().unwrap().len(), 64, "{j:#}");
    }
}

#[test]
fn a_missing_file_refuses_the_submit_unless_allowed_and_then_status_shows_it() {
    let f = farm();
    let scene = asset_scene(f.dir.path(), "missing");
    let o = cli(
        &f.coord.url,
        &["submit", scene.to_str().unwrap(), "--frames", "1"],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("not_there.png") && stderr.contains("//tex/not_there.png"),
        "names the file and how the scene refers to it: {stderr}"
    );
    assert!(stderr.contains("--allow-missing"), "{stderr}");
    let jobs = cli_ok(&f.coord.url, &["jobs", "--json"]);
    assert_eq!(jobs.trim(), "[]", "nothing was submitted");
    let job = submit(&f.coord.url, &scene, &["--frames", "1", "--allow-missing"]);
    let st = status(&f.coord.url, job);
    let missing = st["missing_files"].as_array().unwrap();
    assert_eq!(missing.len(), 1, "{st:#}");
    assert!(missing[0].as_str().unwrap().contains("not_there.png"));
    let human = cli_ok(&f.coord.url, &["status", &job.to_string()]);
    assert!(
        human.contains("missing") && human.contains("not_there.png"),
        "{human}"
    );
    cli_ok(&f.coord.url, &["cancel", &job.to_string()]);
}

#[test]
fn an_unchanged_scene_uploads_nothing_and_a_changed_texture_only_itself() {
    let f = farm();
    let scene = asset_scene(f.dir.path(), "subfolder");
    let out = f.dir.path().join("out1");
    let first = render(&f, &scene, "1", &out);
    assert!(first.contains("uploaded 2 of 2 file(s)"), "{first}");
    let again = render(&f, &scene, "1", &f.dir.path().join("out2"));
    assert!(again.contains("0 bytes uploaded"), "{again}");
    // A new texture (another case's, a different image of the same kind).
    let other = asset_scene(f.dir.path(), "absolute");
    let texture = scene.parent().unwrap().join("tex/checker.png");
    let replacement = other
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("elsewhere/wood.png");
    std::fs::copy(&replacement, &texture).unwrap();
    let size = std::fs::metadata(&texture).unwrap().len();
    let changed = render(&f, &scene, "1", &f.dir.path().join("out3"));
    assert!(
        changed.contains(&format!(
            "uploaded 1 of 2 file(s) (the scene and what it uses): {size} bytes"
        )),
        "only the texture travels: {changed}"
    );
    let refs = f.dir.path().join("refs");
    reference(&scene, 1, 1, &refs);
    assert_same_pixels(
        &f.dir.path().join("out3/frame_0001.png"),
        &refs.join("ref_0001.png"),
    );
}

#[test]
fn two_thousand_small_files_travel_in_one_file_set() {
    let f = farm();
    let scene = asset_scene(f.dir.path(), "many");
    let deps = cli_ok(&f.coord.url, &["deps", scene.to_str().unwrap(), "--json"]);
    let deps: serde_json::Value = serde_json::from_str(&deps).unwrap();
    assert_eq!(
        deps["files"].as_array().unwrap().len(),
        2001,
        "the scene and 2,000 files"
    );
    assert!(deps["files"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["on_coordinator"] == false));
    // Files with the same bytes travel once.
    let distinct: std::collections::HashSet<&str> = deps["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["digest"].as_str().unwrap())
        .collect();
    let out = f.dir.path().join("out");
    let stderr = render(&f, &scene, "2000", &out);
    assert!(
        stderr.contains(&format!("uploaded {} of 2001 file(s)", distinct.len())),
        "{stderr}"
    );
    let refs = f.dir.path().join("refs");
    reference(&scene, 2000, 2000, &refs);
    assert_same_pixels(&out.join("frame_2000.png"), &refs.join("ref_2000.png"));
    let deps = cli_ok(&f.coord.url, &["deps", scene.to_str().unwrap(), "--json"]);
    let deps: serde_json::Value = serde_json::from_str(&deps).unwrap();
    assert!(deps["files"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["on_coordinator"] == true));
}

#[test]
fn files_on_shared_storage_are_not_uploaded_and_workers_read_them_through_their_path_map() {
    let dir = scratch();
    let scene = asset_scene(dir.path(), "absolute");
    let case = scene.parent().unwrap().parent().unwrap();
    let share = case.join("elsewhere");
    // The worker sees the studio's share at another path.
    let mirror = dir.path().join("net/share");
    std::fs::create_dir_all(&mirror).unwrap();
    std::fs::copy(share.join("wood.png"), mirror.join("wood.png")).unwrap();
    let refs = dir.path().join("refs");
    reference(&scene, 1, 1, &refs);
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let map = format!("{}={}", share.display(), mirror.display());
    let _w = worker_with(&coord.url, dir.path(), "a", &["--path-map", &map]);
    let out = dir.path().join("out");
    let o = cli(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1",
            "--shared",
            share.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("uploaded 1 of 2 file(s)"),
        "only the scene travels: {stderr}"
    );
    assert_same_pixels(&out.join("frame_0001.png"), &refs.join("ref_0001.png"));

    // A worker without the mapping cannot render it, and says what to add.
    let dir2 = scratch();
    let coord2 = Coordinator::start(&dir2.path().join("data"), "127.0.0.1:0", &[]);
    let _w2 = worker(&coord2.url, dir2.path(), "b");
    let job = submit(
        &coord2.url,
        &scene,
        &["--frames", "1", "--shared", share.to_str().unwrap()],
    );
    let st = wait_for(
        &coord2.url,
        job,
        std::time::Duration::from_secs(120),
        "the job to fail",
        |s| s["state"] == "failed",
    );
    assert!(
        st["message"].as_str().unwrap().contains("--path-map"),
        "{st:#}"
    );
}

/// `tests/blender/check_file_sets.py` on every case of
/// `make_asset_scenes.py`: `deps.py` lists exactly the expected files,
/// `remap.py` renders a copy of the tree pixel-equal to the original (and an
/// unmapped copy differs), `rewrite_library.py`'s copies render equal with
/// no mapping, and the original tree is left byte for byte as built.
#[test]
fn the_blender_side_of_every_file_set_case_checks_out() {
    let dir = scratch();
    let out = std::process::Command::new("python3")
        .arg(root().join("tests/blender/check_file_sets.py"))
        .arg("--work")
        .arg(dir.path())
        .arg("--blender")
        .arg(blender())
        .output()
        .expect("python3 runs check_file_sets.py; install python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let results: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cases: Vec<&str> = results
        .iter()
        .map(|r| r["case"].as_str().unwrap())
        .collect();
    assert_eq!(
        cases,
        [
            "subfolder",
            "absolute",
            "library",
            "linked-absolute",
            "sequence",
            "udim",
            "missing",
            "many",
            "nested",
            "kinds",
            "linked-kinds"
        ],
        "every case ran:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed: Vec<&serde_json::Value> = results.iter().filter(|r| r["ok"] != true).collect();
    if !failed.is_empty() {
        // Kept for the Blender logs of each step (WORK/logs/CASE/).
        let kept = dir.keep();
        panic!(
            "file-set checks failed (logs under {}):\n{failed:#?}\n{stdout}",
            kept.display()
        );
    }
    assert!(out.status.success(), "{stdout}");
}
