//! Tiled rendering end to end: frames split across real workers, stitched by
//! the coordinator, compared with a single-machine Blender render.

use std::path::Path;
use std::time::Duration;

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

/// A farm of a coordinator and two workers.
struct Farm {
    dir: tempfile::TempDir,
    coord: Coordinator,
    _workers: Vec<Proc>,
}

fn farm(workers: &[&str], extra: &[&str]) -> Farm {
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", extra);
    let ws = workers
        .iter()
        .map(|n| worker(&coord.url, dir.path(), n))
        .collect();
    Farm {
        dir,
        coord,
        _workers: ws,
    }
}

fn render_tiled(f: &Farm, scene: &Path, frames: &str, tiles: &str) -> std::path::PathBuf {
    let out = f.dir.path().join(format!("out-{tiles}-{frames}"));
    let o = out.to_str().unwrap();
    cli_ok(
        &f.coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            frames,
            "--tiles",
            tiles,
            "--wait",
            "-o",
            o,
        ],
    );
    out
}

#[test]
fn adaptive_sampling_png_stitches_exactly_and_tile_blobs_are_cleaned_up() {
    // Adaptive sampling looks at neighbouring pixels: without overscan the
    // seams would differ.
    let scene = scene(&[
        "--kind",
        "still",
        "--width",
        "96",
        "--height",
        "64",
        "--samples",
        "64",
        "--adaptive",
        "--frames",
        "1",
    ]);
    let f = farm(&["a", "b"], &["--blob-grace", "0.5"]);
    let out = render_tiled(&f, &scene, "1", "3x2");
    let refs = f.dir.path().join("refs");
    reference(&scene, 1, 1, &refs);
    assert_same_pixels(&out.join("frame_0001.png"), &refs.join("ref_0001.png"));

    let job: serde_json::Value =
        serde_json::from_str(&cli_ok(&f.coord.url, &["status", "1", "--json"])).unwrap();
    assert_eq!(job["tiles"], "3x2");
    assert_eq!(job["tasks_total"], 6);
    // Chosen from the scene: adaptive sampling needs the margin.
    assert_eq!(job["overscan"], 16, "{job:#}");
    assert_eq!(job["frame_tiles"][0]["stitched"], true, "{job:#}");
    let human = cli_ok(&f.coord.url, &["status", "1"]);
    assert!(
        human.contains("6/6") && human.contains("stitched"),
        "{human}"
    );
    // Only the scene and the stitched frame remain in the blob store, once
    // the collector's grace period (half a second here) has passed.
    let blob_dir = f.dir.path().join("data/blobs");
    eventually(Duration::from_secs(20), || count_blobs(&blob_dir) == 2);
    let blobs = count_blobs(&blob_dir);
    assert_eq!(
        blobs, 2,
        "tile blobs should be removed once the frame is stitched"
    );
}

fn count_blobs(root: &Path) -> usize {
    std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != "tmp")
        .map(|e| std::fs::read_dir(e.path()).unwrap().count())
        .sum()
}

#[test]
fn openexr_float_stitches_exactly() {
    let scene = scene(&[
        "--kind",
        "still",
        "--width",
        "80",
        "--height",
        "60",
        "--samples",
        "32",
        "--adaptive",
        "--format",
        "EXR",
        "--frames",
        "1",
    ]);
    let f = farm(&["a", "b"], &["--blob-grace", "0.5"]);
    let out = render_tiled(&f, &scene, "1", "3x2");
    let refs = f.dir.path().join("refs");
    reference(&scene, 1, 1, &refs);
    let (w, h, got) = exr_channels(&out.join("frame_0001.exr"));
    let (rw, rh, want) = exr_channels(&refs.join("ref_0001.exr"));
    assert_eq!((w, h), (rw, rh));
    let names = |c: &[(String, Vec<f32>)]| c.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want));
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        // Exact: samples are copied bit for bit, never converted.
        let differing = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(differing, 0, "channel {name}: {differing} samples differ");
    }
}

#[test]
fn an_odd_size_in_an_uneven_grid_stitches_exactly() {
    let scene = scene(&[
        "--kind",
        "still",
        "--width",
        "321",
        "--height",
        "239",
        "--percent",
        "50",
        "--samples",
        "16",
        "--adaptive",
        "--frames",
        "1",
    ]);
    // 321x239 at 50 % renders 160x119: 4x3 tiles of 40 x 39-40 px.
    let f = farm(&["a", "b"], &[]);
    let out = render_tiled(&f, &scene, "1", "4x3");
    let refs = f.dir.path().join("refs");
    reference(&scene, 1, 1, &refs);
    let (w, h, _, _) = png_pixels(&out.join("frame_0001.png"));
    assert_eq!((w, h), (160, 119));
    assert_same_pixels(&out.join("frame_0001.png"), &refs.join("ref_0001.png"));

    // The full 321x239: 4x3 tiles of 80-81 x 79-80 px, odd in both directions.
    let full = tessera_tests::scene(&[
        "--kind",
        "still",
        "--width",
        "321",
        "--height",
        "239",
        "--samples",
        "16",
        "--adaptive",
        "--frames",
        "1",
    ]);
    let out = render_tiled(&f, &full, "1", "4x3");
    let refs = f.dir.path().join("refs-full");
    reference(&full, 1, 1, &refs);
    let (w, h, _, _) = png_pixels(&out.join("frame_0001.png"));
    assert_eq!((w, h), (321, 239));
    assert_same_pixels(&out.join("frame_0001.png"), &refs.join("ref_0001.png"));
}

#[test]
fn every_frame_of_a_tiled_animation_is_exact() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "16",
        "--adaptive",
        "--frames",
        "3",
    ]);
    let f = farm(&["a", "b"], &[]);
    let out = render_tiled(&f, &scene, "1-3", "2x2");
    let refs = f.dir.path().join("refs");
    reference(&scene, 1, 3, &refs);
    for n in 1..=3 {
        assert_same_pixels(
            &out.join(format!("frame_{n:04}.png")),
            &refs.join(format!("ref_{n:04}.png")),
        );
    }
}

#[test]
fn a_worker_killed_mid_tile_loses_nothing() {
    let scene = scene(&[
        "--kind",
        "still",
        "--width",
        "96",
        "--height",
        "64",
        "--samples",
        "64",
        "--adaptive",
        "--frames",
        "1",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--lease-ttl", "2"],
    );
    let mut a = worker(&coord.url, dir.path(), "a");
    let job = submit(&coord.url, &scene, &["--frames", "1", "--tiles", "2x2"]);
    wait_for(&coord.url, job, LONG, "a tile to be leased", |j| {
        j["tasks_running"].as_u64().unwrap() >= 1
    });
    // Mid-tile: the worker has started Blender on it.
    assert!(
        eventually(LONG, || a.log().contains("Blender session started")),
        "the worker never started rendering its tile:\n{}",
        a.log()
    );
    a.kill9();
    let _b = worker(&coord.url, dir.path(), "b");
    let done = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
    let refs = dir.path().join("refs");
    reference(&scene, 1, 1, &refs);
    assert_same_pixels(&out.join("frame_0001.png"), &refs.join("ref_0001.png"));
}

#[test]
fn tile_grids_and_formats_that_cannot_work_are_refused_at_submit() {
    let png = scene(&[
        "--kind", "still", "--width", "64", "--height", "48", "--frames", "1",
    ]);
    let f = farm(&[], &["--max-tiles", "64"]);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--tiles", "65x1"], "tiles under 1 px in a 64x48 frame"),
        (vec!["--tiles", "9x9"], "over the limit of 64 tiles"),
        (vec!["--tiles", "0x2"], "is not a tile grid"),
        (vec!["--tiles", "2by2"], "is not a tile grid"),
    ];
    for (args, want) in cases {
        let mut all = vec!["submit", png.to_str().unwrap(), "--frames", "1"];
        all.extend_from_slice(&args);
        let out = cli(&f.coord.url, &all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stderr.contains(want),
            "{args:?}: expected `{want}` in: {stderr}"
        );
    }
    // A JPEG scene cannot be stitched exactly: refused, naming the fix.
    let jpeg = f.dir.path().join("jpeg.blend");
    let expr = format!(
        "import bpy; bpy.context.scene.render.image_settings.file_format = 'JPEG'; bpy.ops.wm.save_as_mainfile(filepath={:?})",
        jpeg.to_str().unwrap()
    );
    let made = std::process::Command::new(blender())
        .arg("-b")
        .arg(&png)
        .args(["--python-exit-code", "2", "--python-expr", &expr])
        .output()
        .unwrap();
    assert!(made.status.success() && jpeg.is_file());
    let out = cli(
        &f.coord.url,
        &[
            "submit",
            jpeg.to_str().unwrap(),
            "--frames",
            "1",
            "--tiles",
            "2x2",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("output format is JPEG") && stderr.contains("PNG or OpenEXR"),
        "{stderr}"
    );
    // Whole frames of the same scene are fine.
    cli_ok(
        &f.coord.url,
        &["submit", jpeg.to_str().unwrap(), "--frames", "1"],
    );
    let jobs: serde_json::Value =
        serde_json::from_str(&cli_ok(&f.coord.url, &["jobs", "--json"])).unwrap();
    assert_eq!(
        jobs.as_array().unwrap().len(),
        1,
        "only the untiled job was accepted"
    );
}

/// Submits frame 1 of `scene` in `tiles` and waits until the job is done.
fn submit_done(f: &Farm, scene: &Path, tiles: &str) -> u64 {
    let job = submit(&f.coord.url, scene, &["--frames", "1", "--tiles", tiles]);
    let end = wait_for(&f.coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(end["state"], "done", "{end:#}");
    job
}

#[test]
fn frames_larger_than_cycles_tile_size_render_exactly_whole_and_in_farm_tiles() {
    // 256x192 with Cycles' tile size 64: Cycles renders 12 tiles of its own
    // and prints `Rendered 3/12 Tiles, Sample 1/4`, never `| Sample 1/4`.
    let scene = scene(&[
        "--kind",
        "still",
        "--width",
        "256",
        "--height",
        "192",
        "--samples",
        "4",
        "--tile-size",
        "64",
        "--frames",
        "1",
    ]);
    let f = farm(&["a", "b"], &[]);
    let refs = f.dir.path().join("refs");
    reference(&scene, 1, 1, &refs);
    for tiles in ["1x1", "2x2"] {
        let job = submit_done(&f, &scene, tiles);
        let out = f.dir.path().join(format!("out-{tiles}"));
        cli_ok(
            &f.coord.url,
            &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
        );
        assert_same_pixels(&out.join("frame_0001.png"), &refs.join("ref_0001.png"));
        let st = status(&f.coord.url, job);
        assert_eq!(st["tasks"][0]["attempts"], 0, "no failed attempt: {st:#}");
        // Each pixel renders on its own (no adaptive sampling, denoising or
        // compositing), so the tiles had no overscan and still stitched
        // exactly.
        assert_eq!(st["overscan"], 0, "{st:#}");
    }
}

#[test]
fn a_4k_uhd_frame_at_one_sample_renders_in_cycles_tiles_exactly() {
    // Blender's default tile size (2048) splits a 3840x2160 frame in 4.
    let scene = scene(&[
        "--kind",
        "still",
        "--width",
        "3840",
        "--height",
        "2160",
        "--samples",
        "1",
        "--frames",
        "1",
    ]);
    let f = farm(&["a"], &[]);
    let out = f.dir.path().join("out");
    let started = std::time::Instant::now();
    submit_wait(&f.coord.url, &scene, "1", &out);
    eprintln!(
        "4K frame through the farm: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let refs = f.dir.path().join("refs");
    let started = std::time::Instant::now();
    reference(&scene, 1, 1, &refs);
    eprintln!(
        "4K frame with blender -b: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_same_pixels(&out.join("frame_0001.png"), &refs.join("ref_0001.png"));
}
