//! Preview videos end to end: a real coordinator, real workers and real
//! Blender render a job, the coordinator makes its MP4 with the real ffmpeg,
//! and `ffprobe` checks what came out (frames, size, frame rate, codec).
//! Needs Debian's `ffmpeg` (scripts/test.sh installs it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

/// A coordinator (with `--http` and `extra`) and one worker.
struct Farm {
    dir: tempfile::TempDir,
    coord: Coordinator,
    _worker: Proc,
}

fn farm(extra: &[&str]) -> Farm {
    let dir = scratch();
    let mut args = vec!["--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &args);
    let w = worker(&coord.url, dir.path(), "w");
    Farm {
        dir,
        coord,
        _worker: w,
    }
}

/// What ffprobe says about the first video stream of `mp4`, with its
/// frames counted by decoding them.
fn ffprobe(mp4: &Path) -> Value {
    let out = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-count_frames",
            "-select_streams",
            "v:0",
            "-show_entries",
            "stream=codec_name,pix_fmt,width,height,r_frame_rate,nb_read_frames",
            "-of",
            "json",
        ])
        .arg(mp4)
        .output()
        .expect("ffprobe runs (install ffmpeg: apt-get install ffmpeg; scripts/test.sh does)");
    assert!(
        out.status.success(),
        "ffprobe {}: {}",
        mp4.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["streams"][0].clone()
}

/// Every frame of `mp4` decoded by ffmpeg to 8-bit RGB.
fn video_frames(mp4: &Path, w: usize, h: usize) -> Vec<Vec<u8>> {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-nostdin", "-i"])
        .arg(mp4)
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .output()
        .expect("ffmpeg runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout.chunks(w * h * 3).map(<[u8]>::to_vec).collect()
}

/// The RGB samples of an 8-bit RGB or RGBA PNG frame (alpha dropped).
fn png_rgb(path: &Path) -> Vec<u8> {
    let (_, _, kind, px) = png_pixels(path);
    let step = if kind.starts_with("Rgba") { 4 } else { 3 };
    px.chunks(step).flat_map(|p| p[..3].to_vec()).collect()
}

/// Mean absolute difference of two equally long sample lists.
fn distance(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let sum: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    sum as f64 / a.len() as f64
}

/// Whether the MP4's index (`moov`) comes before its data (`mdat`), as
/// `-movflags +faststart` puts it.
fn index_first(mp4: &[u8]) -> bool {
    let at = |tag: &[u8]| mp4.windows(4).position(|w| w == tag);
    matches!((at(b"moov"), at(b"mdat")), (Some(m), Some(d)) if m < d)
}

fn wait_preview(url: &str, job: u64, state: &str) -> Value {
    wait_for(url, job, LONG, &format!("the preview to be {state}"), |j| {
        let s = j["preview"]["state"].as_str().unwrap_or("");
        s == state || (s == "failed" && state != "failed")
    })
}

#[test]
fn a_12_frame_job_with_preview_gives_an_mp4_of_12_frames_at_the_scenes_size_and_fps() {
    let scene = scene(&[
        "--frames", "12", "--fps", "12", "--width", "64", "--height", "48",
    ]);
    let f = farm(&[]);
    let url = &f.coord.url;
    let frames = f.dir.path().join("frames");
    let job = submit(
        url,
        &scene,
        &["--preview", "--wait", "-o", frames.to_str().unwrap()],
    );
    let j = wait_preview(url, job, "ready");
    assert_eq!(j["state"], "done");
    assert_eq!(j["fps"], 12.0, "the scene's rate is stored with the job");
    let p = &j["preview"];
    assert_eq!(p["state"], "ready", "{j:#}");
    assert_eq!(
        (&p["frames"], &p["width"], &p["height"], &p["fps"]),
        (
            &Value::from(12),
            &Value::from(64),
            &Value::from(48),
            &Value::from(12.0)
        )
    );
    let human = cli_ok(url, &["status", &job.to_string()]);
    assert!(
        human.contains("preview   ready: 12 frames, 64x48 at 12 fps"),
        "{human}"
    );

    let mp4 = f.dir.path().join("out.mp4");
    cli_ok(
        url,
        &[
            "fetch",
            &job.to_string(),
            "--preview",
            "-o",
            mp4.to_str().unwrap(),
        ],
    );
    let s = ffprobe(&mp4);
    assert_eq!(s["codec_name"], "h264", "{s}");
    assert_eq!(s["pix_fmt"], "yuv420p", "{s}");
    assert_eq!(
        (&s["width"], &s["height"]),
        (&Value::from(64), &Value::from(48)),
        "{s}"
    );
    assert_eq!(s["r_frame_rate"], "12/1", "{s}");
    assert_eq!(s["nb_read_frames"], "12", "{s}");
    let bytes = std::fs::read(&mp4).unwrap();
    assert!(index_first(&bytes), "the index comes first (+faststart)");
    assert_eq!(p["digest"], blake3::hash(&bytes).to_hex().as_str());

    // In frame order: video frame i looks most like rendered frame i.
    let decoded = video_frames(&mp4, 64, 48);
    assert_eq!(decoded.len(), 12);
    let rendered: Vec<Vec<u8>> = (1..=12)
        .map(|n| png_rgb(&frames.join(format!("frame_{n:04}.png"))))
        .collect();
    for (i, v) in decoded.iter().enumerate() {
        let d: Vec<f64> = rendered.iter().map(|r| distance(v, r)).collect();
        let nearest = d
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        assert_eq!(
            nearest, i,
            "video frame {i} is nearest rendered frame {nearest}: {d:?}"
        );
        assert!(d[i] < 6.0, "video frame {i} differs by {} on average", d[i]);
    }

    // The dashboard's route serves the same bytes as video/mp4, and ranges.
    let base = f
        .coord
        .metrics
        .as_ref()
        .unwrap()
        .trim_end_matches("/metrics");
    let admin = f.coord.admin_token();
    let r = tessera_tests::http::get(&format!("{base}/api/v1/jobs/{job}/preview"), &admin);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("video/mp4"));
    assert_eq!(r.body, bytes);
    let r = tessera_tests::http::request(
        "GET",
        &format!("{base}/api/v1/jobs/{job}/preview"),
        Some(&admin),
        &[("Range", "bytes=0-99")],
        &[],
    );
    assert_eq!(r.status, 206);
    assert_eq!(r.body, bytes[..100]);

    // The dashboard's job page plays it.
    dashboard_plays(&f, base, job, &admin);
}

/// Signs in to the dashboard at `base` with `token`, opens job `job`'s page
/// and waits until its `<video>` has loaded the 64x48, one-second preview.
fn dashboard_plays(f: &Farm, base: &str, job: u64, token: &str) {
    use tessera_tests::browser::{chromium, Browser};
    let Some(binary) = chromium() else {
        eprintln!("SKIPPED the dashboard check: chromium is not installed (scripts/test.sh installs it; or set TESSERA_CHROMIUM)");
        return;
    };
    let mut b = Browser::start(&binary, f.dir.path(), 1024, 800);
    b.sign_in(&format!("{base}/jobs/{job}"), token);
    b.goto(&format!("{base}/jobs/{job}"));
    assert!(
        b.wait_for(
            "document.querySelector('video#preview')",
            Duration::from_secs(20)
        ),
        "no video on the job page: {}",
        b.eval("document.body.innerText")
    );
    assert_eq!(
        b.eval("new URL(document.querySelector('video#preview').src).pathname"),
        serde_json::json!(format!("/api/v1/jobs/{job}/preview"))
    );
    let loaded = "(() => { const v = document.querySelector('video#preview'); return v.readyState >= 1 && v.videoWidth === 64 && v.videoHeight === 48 && Math.abs(v.duration - 1) < 0.05; })()";
    assert!(
        b.wait_for(loaded, Duration::from_secs(30)),
        "the browser did not load the video: {}",
        b.eval("(() => { const v = document.querySelector('video#preview'); return JSON.stringify({ready: v.readyState, w: v.videoWidth, h: v.videoHeight, d: v.duration, err: v.error && v.error.message, mp4: v.canPlayType('video/mp4; codecs=\"avc1.42E01E\"')}); })()")
    );
}

#[test]
fn a_tiled_exr_job_of_odd_size_gets_a_tone_mapped_preview_on_demand() {
    let scene = scene(&[
        "--kind", "still", "--format", "EXR", "--frames", "3", "--fps", "25", "--width", "65",
        "--height", "49",
    ]);
    let f = farm(&[]);
    let url = &f.coord.url;
    let job = submit(url, &scene, &["--tiles", "2x1", "--wait"]);
    let j = status(url, job);
    assert_eq!(j["state"], "done");
    assert_eq!(j["preview"], Value::Null, "none asked for yet");

    // `tessera preview` asks for it, waits, and downloads it.
    let mp4 = f.dir.path().join("tiled.mp4");
    let out = cli(
        url,
        &["preview", &job.to_string(), "-o", mp4.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}\ncoordinator log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        f.coord.proc.log()
    );
    let s = ffprobe(&mp4);
    assert_eq!(s["nb_read_frames"], "3", "{s}");
    assert_eq!(s["r_frame_rate"], "25/1", "{s}");
    // yuv420p needs even sides: one pixel of padding each way.
    assert_eq!(
        (&s["width"], &s["height"]),
        (&Value::from(66), &Value::from(50)),
        "{s}"
    );
    // Linear light was tone-mapped: neither black nor blown out.
    let first = &video_frames(&mp4, 66, 50)[0];
    let mean = first.iter().map(|&v| f64::from(v)).sum::<f64>() / first.len() as f64;
    assert!((20.0..235.0).contains(&mean), "mean brightness {mean}");
    // The stitched frames went in: a tile missing would leave half black.
    let (left, right): (Vec<u8>, Vec<u8>) = first
        .chunks(66 * 3)
        .flat_map(|row| {
            let (l, r) = row.split_at(33 * 3);
            l.iter().zip(r).map(|(a, b)| (*a, *b)).collect::<Vec<_>>()
        })
        .unzip();
    for half in [&left, &right] {
        assert!(half.iter().any(|&v| v > 20), "a half of the frame is black");
    }
    let again = status(url, job);
    assert_eq!(again["preview"]["state"], "ready");
    assert_eq!(again["preview"]["fps"], 25.0);
}

#[test]
fn without_ffmpeg_the_job_is_done_its_frames_fetch_and_status_says_why() {
    let scene = scene(&["--frames", "2", "--fps", "12"]);
    let f = farm(&["--ffmpeg", "/nonexistent/ffmpeg"]);
    let url = &f.coord.url;
    let job = submit(url, &scene, &["--frames", "1-2", "--preview", "--wait"]);
    let j = wait_preview(url, job, "failed");
    assert_eq!(j["state"], "done", "the job succeeds without its preview");
    let why = j["preview"]["message"].as_str().unwrap();
    assert!(why.contains("/nonexistent/ffmpeg"), "{why}");
    assert!(why.contains("apt-get install ffmpeg"), "{why}");
    let human = cli_ok(url, &["status", &job.to_string()]);
    assert!(
        human.contains("preview   failed: ffmpeg could not be started"),
        "{human}"
    );

    let frames: PathBuf = f.dir.path().join("frames");
    cli_ok(
        url,
        &["fetch", &job.to_string(), "-o", frames.to_str().unwrap()],
    );
    assert!(frames.join("frame_0001.png").is_file() && frames.join("frame_0002.png").is_file());

    // `tessera preview` tries again, and fails with the same words.
    let out = cli(
        url,
        &[
            "preview",
            &job.to_string(),
            "-o",
            f.dir.path().join("x.mp4").to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("could not be made") && err.contains("ffmpeg"),
        "{err}"
    );
    let out = cli(url, &["fetch", &job.to_string(), "--preview"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not be made"));
}
