//! Whether a frame is one Blender really rendered for this task.
//!
//! A render that "finished" proves nothing: after some failures Blender's next
//! render in the same process returns at once with a black frame (measured
//! with Blender 3.4.1: `RenderTime 00:00.00` in its PNG metadata, and no
//! `Sample N/M` line at all). Render-time metadata cannot tell that apart from
//! a real render, because a warm render of a small scene also reports
//! `00:00.00` at that precision; Cycles' sample count can. So a frame counts
//! only when
//! - it lies in the task's folder and was written after this render began
//!   (its mtime is not older than a marker the worker wrote just before
//!   sending the command: both come from the same kernel clock),
//! - it measures what the scene renders (resolution times percentage) or, for
//!   a tile, exactly the tile's size,
//! - and, for Cycles, Blender printed at least one finished sample
//!   (`Sample N/M`, or `Rendered R/N Tiles, Sample S/M` for a frame larger
//!   than Cycles' tile size; read by `blender/cycles_progress.py`).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::session_protocol::Done;

/// Name of the marker file written before each render command.
pub const MARKER: &str = ".tessera-render-started";

/// What the session reported for one rendered frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// The image file.
    pub path: PathBuf,
    /// Its size as the session read it.
    pub size: (u32, u32),
    /// The size the scene renders, as the session computed it.
    pub expected: (u32, u32),
    /// The render engine (`CYCLES`, `BLENDER_EEVEE`, ...).
    pub engine: String,
    /// Most samples Cycles said it finished; None when it said nothing.
    pub samples_done: Option<u32>,
    /// Whether the session counted samples at all.
    pub counted: bool,
    /// Extra outputs: (name relative to the passes folder, file).
    pub passes: Vec<(String, PathBuf)>,
}

impl From<&Done> for Reported {
    /// What a session's `done` answer reports.
    fn from(d: &Done) -> Self {
        Self {
            path: d.path.clone(),
            size: (d.width, d.height),
            expected: (d.expected[0], d.expected[1]),
            engine: d.engine.clone(),
            samples_done: d.samples_done,
            counted: d.counted,
            passes: d
                .passes
                .iter()
                .map(|p| (p.name.clone(), p.path.clone()))
                .collect(),
        }
    }
}

/// What the worker found on disk for a reported frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The file is a regular, non-empty file inside the task's folder.
    pub in_task_folder: bool,
    /// Its size in bytes (0 when missing).
    pub bytes: u64,
    /// It was written after the render began.
    pub fresh: bool,
    /// Its pixel size read from its header, where the worker can read it.
    pub size: Option<(u32, u32)>,
}

/// Looks at the reported file: where it is, how large, how fresh.
pub fn inspect(out_dir: &Path, path: &Path, started: SystemTime) -> Found {
    let meta = std::fs::symlink_metadata(path).ok().filter(|m| m.is_file());
    let inside = path.starts_with(out_dir)
        && path
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir));
    Found {
        in_task_folder: inside && meta.is_some(),
        bytes: meta.as_ref().map_or(0, |m| m.len()),
        fresh: fresh(path, started),
        size: crate::image_size::image_size(path).ok(),
    }
}

/// Whether `path` is a regular file written at or after `started`.
pub fn fresh(path: &Path, started: SystemTime) -> bool {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .and_then(|m| m.modified().ok())
        .is_some_and(|t| t >= started)
}

/// Writes the marker and returns its modification time, the instant a render
/// began on the file system's own clock.
pub fn mark_start(out_dir: &Path, frame: u32) -> std::io::Result<SystemTime> {
    let marker = out_dir.join(MARKER);
    std::fs::write(&marker, format!("frame {frame}\n"))?;
    std::fs::metadata(&marker)?.modified()
}

/// The size a frame must have: the tile's when rendering a tile, else what
/// the scene renders.
pub fn expected_size(reported: &Reported, tile: Option<(u32, u32)>) -> (u32, u32) {
    tile.unwrap_or(reported.expected)
}

/// Judges one frame; `Err` says, in a line, why it is not trusted.
pub fn judge(
    frame: u32,
    reported: &Reported,
    found: &Found,
    expected: (u32, u32),
) -> Result<(), String> {
    let shown = reported.path.display();
    if !found.in_task_folder {
        return Err(format!(
            "Blender reported `{shown}` for frame {frame}, which is not a file in the task's folder"
        ));
    }
    if found.bytes == 0 {
        return Err(format!("Blender wrote an empty image for frame {frame}"));
    }
    if !found.fresh {
        return Err(format!(
            "`{shown}` is older than the render of frame {frame}: Blender did not write it this time"
        ));
    }
    let size = found.size.unwrap_or(reported.size);
    if size != expected || expected.0 == 0 || expected.1 == 0 {
        return Err(format!(
            "frame {frame} came out {}x{} but should be {}x{}",
            size.0, size.1, expected.0, expected.1
        ));
    }
    if reported.engine == "CYCLES" && reported.counted && reported.samples_done.unwrap_or(0) == 0 {
        return Err(format!(
            "Blender finished frame {frame} without rendering a single sample (Cycles printed no \
             `Sample N/M` nor `Rendered R/N Tiles, Sample S/M`): the image is not a real render"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> (Reported, Found) {
        (
            Reported {
                path: "/w/1/frame_0001.png".into(),
                size: (64, 48),
                expected: (64, 48),
                engine: "CYCLES".into(),
                samples_done: Some(8),
                counted: true,
                passes: vec![],
            },
            Found {
                in_task_folder: true,
                bytes: 900,
                fresh: true,
                size: Some((64, 48)),
            },
        )
    }

    #[test]
    fn a_real_render_passes() {
        let (r, f) = good();
        assert_eq!(judge(1, &r, &f, (64, 48)), Ok(()));
    }

    #[test]
    fn a_render_without_samples_is_refused() {
        let (mut r, f) = good();
        r.samples_done = None;
        let e = judge(1, &r, &f, (64, 48)).unwrap_err();
        assert!(e.contains("without rendering a single sample"), "{e}");
        r.samples_done = Some(0);
        assert!(judge(1, &r, &f, (64, 48)).is_err());
        // Other engines print no Cycles samples.
        r.engine = "BLENDER_EEVEE".into();
        assert_eq!(judge(1, &r, &f, (64, 48)), Ok(()));
    }

    #[test]
    fn stale_misplaced_empty_or_wrongly_sized_frames_are_refused() {
        let (r, f) = good();
        let stale = Found {
            fresh: false,
            ..f.clone()
        };
        assert!(judge(1, &r, &stale, (64, 48))
            .unwrap_err()
            .contains("older than the render"));
        let elsewhere = Found {
            in_task_folder: false,
            ..f.clone()
        };
        assert!(judge(1, &r, &elsewhere, (64, 48)).is_err());
        let empty = Found {
            bytes: 0,
            ..f.clone()
        };
        assert!(judge(1, &r, &empty, (64, 48)).is_err());
        let e = judge(1, &r, &f, (32, 24)).unwrap_err();
        assert!(e.contains("64x48 but should be 32x24"), "{e}");
        // Without a header the worker can read, the session's reading counts.
        let unreadable = Found {
            size: None,
            ..f.clone()
        };
        let mut small = r.clone();
        small.size = (10, 10);
        assert!(judge(1, &small, &unreadable, (64, 48)).is_err());
    }

    #[test]
    fn freshness_is_read_from_the_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("frame_0001.png");
        std::fs::write(&old, b"old").unwrap();
        let t = SystemTime::now() - std::time::Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(t)
            .unwrap();
        let started = mark_start(dir.path(), 1).unwrap();
        assert!(!inspect(dir.path(), &old, started).fresh);
        let new = dir.path().join("frame_0002.png");
        std::fs::write(&new, b"new").unwrap();
        let found = inspect(dir.path(), &new, started);
        assert!(found.fresh && found.in_task_folder && found.bytes == 3);
        let outside = inspect(dir.path(), Path::new("/etc/hostname"), started);
        assert!(!outside.in_task_folder);
        let expected = expected_size(&good().0, Some((5, 6)));
        assert_eq!(expected, (5, 6));
    }

    #[test]
    fn replies_are_read() {
        let done = |v: serde_json::Value| match crate::session_protocol::read(&v.to_string()) {
            Ok(crate::session_protocol::Reply::Done(d)) => d,
            other => panic!("{other:?}"),
        };
        let v = serde_json::json!({
            "event": "done", "id": 1, "path": "/w/frame_0001.png", "width": 64, "height": 48,
            "expected": [64, 48], "engine": "CYCLES", "samples_done": 8, "samples_total": 8,
            "counted": true, "seconds": 0.5,
            "passes": [{"name": "File Output/Image0001.png", "path": "/w/passes/File Output/Image0001.png"}]
        });
        let r = Reported::from(&done(v));
        assert_eq!(r.expected, (64, 48));
        assert_eq!(r.samples_done, Some(8));
        assert_eq!(r.passes.len(), 1);
        let v = serde_json::json!({
            "event": "done", "id": 2, "path": "/w/frame_0002.png", "width": 64, "height": 48,
            "expected": [64, 48], "engine": "CYCLES", "samples_done": null,
            "samples_total": null, "counted": true, "seconds": 0.5, "passes": []
        });
        assert_eq!(Reported::from(&done(v)).samples_done, None);
    }

    /// Runs `blender/cycles_progress.py` (the parser the session uses inside
    /// Blender) on `lines`; None when no Python 3 is installed here.
    fn cycles_progress(lines: &[&str]) -> Option<Vec<Option<(u32, u32)>>> {
        use std::io::Write;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../blender/cycles_progress.py");
        let mut child = match std::process::Command::new("python3")
            .arg("-I")
            .arg(&script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("python3 {}: {e}", script.display()),
        };
        let mut stdin = child.stdin.take().unwrap();
        for l in lines {
            writeln!(stdin, "{l}").unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Option<(u32, u32)>>(l).unwrap())
                .collect(),
        )
    }

    #[test]
    fn every_form_of_cycles_progress_counts_samples() {
        // As Blender 3.4.1 and 4.5.15 print them (the tiled lines from a
        // 256x192 frame with tile size 64: 12 tiles of 4 samples).
        let head = "Fra:1 Mem:10.07M (Peak 10.83M) | Time:00:00.16 | Remaining:00:00.24 | \
                    Mem:0.92M, Peak:0.92M | Scene, ViewLayer | ";
        let forms: &[(&str, Option<(u32, u32)>)] = &[
            ("Sample 0/8", Some((0, 8))),
            ("Sample 4/8", Some((4, 8))),
            ("Sample 8/8", Some((8, 8))),
            // Cycles appends a device's status in brackets.
            ("Sample 1/8 (Compiling kernels)", Some((1, 8))),
            ("Rendered 0/12 Tiles, Sample 0/4", Some((0, 48))),
            ("Rendered 0/12 Tiles, Sample 1/4", Some((1, 48))),
            // The first tile just finished: only it can have.
            ("Rendered 0/12 Tiles, Sample 4/4", Some((4, 48))),
            ("Rendered 1/12 Tiles, Sample 4/4", Some((4, 48))),
            ("Rendered 1/12 Tiles, Sample 1/4", Some((5, 48))),
            // Tile 3 finished or tile 2 was just counted: the lower bound.
            ("Rendered 2/12 Tiles, Sample 4/4", Some((8, 48))),
            ("Rendered 11/12 Tiles, Sample 3/4", Some((47, 48))),
            // After the last tile Cycles resets its sample count.
            ("Rendered 11/12 Tiles, Sample 0/4", Some((44, 48))),
            // A 4K UHD frame at 1 sample with the default tile size 2048.
            ("Rendered 1/4 Tiles, Sample 1/1", Some((1, 4))),
            ("Rendered 3/4 Tiles, Sample 0/1", Some((3, 4))),
            // Not progress: other status lines, impossible numbers.
            ("Synchronizing object | Cube", None),
            ("Finished", None),
            ("Sample 9/8", None),
            ("Rendered 13/12 Tiles, Sample 1/4", None),
            ("Sample 1/0", None),
        ];
        let lines: Vec<String> = forms.iter().map(|(l, _)| format!("{head}{l}")).collect();
        let mut lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        // A name that reads like progress is not progress without the bar.
        lines.push("Read blend: /tmp/Sample 4/4.blend");
        let Some(got) = cycles_progress(&lines) else {
            eprintln!("skipped: no python3 on PATH to run blender/cycles_progress.py");
            return;
        };
        let mut want: Vec<Option<(u32, u32)>> = forms.iter().map(|(_, v)| *v).collect();
        want.push(None);
        for ((line, g), w) in lines.iter().zip(&got).zip(&want) {
            assert_eq!(g, w, "{line}");
        }
        assert_eq!(got.len(), want.len());
    }
}
