//! Running Blender headless, and telling a real render from a failed one.
//!
//! Blender exits 0 on many failures (Python errors, missing textures), so a
//! render only counts when Blender exited 0, printed no error line, and wrote
//! a fresh image for every frame into an output directory that was empty
//! before it started.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

use crate::error::Error;

/// Lines of Blender's output kept for a failure report.
const LOG_TAIL_LINES: usize = 80;

/// Exit status Blender is asked to use when a Python script fails.
const PYTHON_EXIT_CODE: &str = "3";

/// Which Cycles device a render uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// CPU Cycles.
    Cpu,
}

impl Device {
    /// Cycles' name for the device type.
    pub fn cycles_name(self) -> &'static str {
        match self {
            Self::Cpu => "CPU",
        }
    }
}

/// One render to do.
#[derive(Debug, Clone)]
pub struct RenderRequest {
    /// The scene file.
    pub scene: PathBuf,
    /// Frames, ascending.
    pub frames: Vec<u32>,
    /// An empty directory for the images.
    pub out_dir: PathBuf,
    /// Render threads (None: Blender's default, all cores).
    pub threads: Option<u32>,
}

/// A rendered image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedFrame {
    /// Frame number.
    pub frame: u32,
    /// The image file.
    pub path: PathBuf,
    /// Its extension without the dot.
    pub ext: String,
}

/// Why a render did not produce its frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderFailure {
    /// Blender failed; the reason and the tail of its log.
    Failed {
        /// One line saying what went wrong.
        reason: String,
        /// The last lines Blender printed.
        log_tail: String,
    },
    /// The render was stopped on request.
    Stopped,
}

/// Something that turns a scene and frames into images. The real one runs
/// Blender; tests of the lease loop may use a `Fake*` one.
pub trait Renderer: Send + Sync + 'static {
    /// Renders `req`, counting finished frames in `done`, until done or until
    /// `stop` turns true.
    fn render(
        &self,
        req: RenderRequest,
        done: Arc<AtomicU32>,
        stop: watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = Result<Vec<RenderedFrame>, RenderFailure>> + Send;
}

/// Runs a fresh `blender -b` process per render.
#[derive(Debug, Clone)]
pub struct BlenderProcess {
    /// The Blender executable.
    pub blender: PathBuf,
    /// The Cycles device.
    pub device: Device,
}

/// Asks Blender for its version line (`Blender 3.4.1`).
pub async fn blender_version(blender: &Path) -> Result<String, Error> {
    let fail = |reason: String| Error::Blender {
        path: blender.display().to_string(),
        reason,
    };
    let out = Command::new(blender)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with("Blender "))
        .map(|l| l.trim().to_string())
        .ok_or_else(|| {
            fail(format!(
                "`--version` printed no version (exit {})",
                out.status
            ))
        })
}

/// Whether a line of Blender's output reports a failure that Blender itself
/// may not turn into a non-zero exit status.
pub fn is_error_line(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("Error:")
        || l.starts_with("Error in PyDriver")
        || l.starts_with("Error in Driver")
        || l.starts_with("Traceback (most recent call last)")
        || l.contains("| Error: ")
        || l.starts_with("Render error")
        || l.starts_with("ERROR (bke.fcurve)")
        || l.starts_with("Cannot save Node File Output")
        || l.starts_with("imb_savepng: Cannot open file for writing")
}

impl Renderer for BlenderProcess {
    async fn render(
        &self,
        req: RenderRequest,
        done: Arc<AtomicU32>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Vec<RenderedFrame>, RenderFailure> {
        let failed = |reason: String, log_tail: String| RenderFailure::Failed { reason, log_tail };
        let frames: Vec<String> = req.frames.iter().map(u32::to_string).collect();
        let mut cmd = Command::new(&self.blender);
        cmd.arg("-b")
            .arg(&req.scene)
            .args(["--python-exit-code", PYTHON_EXIT_CODE])
            .arg("-o")
            .arg(req.out_dir.join("frame_####"));
        if let Some(t) = req.threads {
            cmd.args(["-t", &t.to_string()]);
        }
        cmd.arg("-f")
            .arg(frames.join(","))
            .args(["--", "--cycles-device", self.device.cycles_name()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            failed(
                format!("cannot start Blender `{}`: {e}", self.blender.display()),
                String::new(),
            )
        })?;
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (line_tx, mut line_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        for stream in [
            Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(stderr),
        ] {
            let tx = line_tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        drop(line_tx);
        let mut tail: VecDeque<String> = VecDeque::with_capacity(LOG_TAIL_LINES);
        let mut errors: Vec<String> = Vec::new();
        let mut saved = 0u32;
        let mut status = None;
        let mut lines_open = true;
        let mut stop_open = !*stop.borrow();
        while status.is_none() || lines_open {
            tokio::select! {
                line = line_rx.recv(), if lines_open => match line {
                    Some(line) => {
                        if line.starts_with("Saved: ") {
                            saved += 1;
                            done.store(saved, Ordering::Relaxed);
                        }
                        if is_error_line(&line) && errors.len() < 5 {
                            errors.push(line.trim().to_string());
                        }
                        if tail.len() == LOG_TAIL_LINES {
                            tail.pop_front();
                        }
                        tail.push_back(line);
                    }
                    None => lines_open = false,
                },
                s = child.wait(), if status.is_none() => {
                    status = Some(s.map_err(|e| failed(format!("lost track of Blender: {e}"), String::new()))?);
                }
                r = stop.changed(), if stop_open => {
                    if r.is_err() {
                        stop_open = false;
                    } else if *stop.borrow() {
                        let _ = child.start_kill();
                        let _ = child.wait().await;
                        return Err(RenderFailure::Stopped);
                    }
                }
            }
        }
        let status = status.expect("loop ends with a status");
        let log_tail = Vec::from(tail).join("\n");
        if !status.success() {
            let reason = match errors.first() {
                Some(e) => format!("Blender failed ({status}): {e}"),
                None => format!("Blender failed ({status})"),
            };
            return Err(failed(reason, log_tail));
        }
        if let Some(e) = errors.first() {
            return Err(failed(
                format!("Blender reported an error although it exited 0: {e}"),
                log_tail,
            ));
        }
        collect_outputs(&req.out_dir, &req.frames).map_err(|reason| failed(reason, log_tail))
    }
}

/// Finds one image per frame in `dir`, named `frame_NNNN.ext`.
pub fn collect_outputs(dir: &Path, frames: &[u32]) -> Result<Vec<RenderedFrame>, String> {
    let mut found: Vec<RenderedFrame> = Vec::new();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read output directory {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("frame_") else {
            continue;
        };
        let Some((num, ext)) = rest.split_once('.') else {
            continue;
        };
        let Ok(frame) = num.parse::<u32>() else {
            continue;
        };
        if entry.metadata().map(|m| m.len() == 0).unwrap_or(true) {
            return Err(format!("Blender wrote an empty image for frame {frame}"));
        }
        found.push(RenderedFrame {
            frame,
            path: entry.path(),
            ext: ext.to_ascii_lowercase(),
        });
    }
    found.sort_by_key(|f| f.frame);
    let got: Vec<u32> = found.iter().map(|f| f.frame).collect();
    let missing: Vec<u32> = frames
        .iter()
        .copied()
        .filter(|f| !got.contains(f))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "Blender exited 0 but wrote no image for frame(s) {missing:?}; check the scene's output settings and the log"
        ));
    }
    found.retain(|f| frames.contains(&f.frame));
    Ok(found)
}

/// Makes Blender die with the worker, so a killed worker leaves no orphan render.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_lines() {
        assert!(is_error_line(
            "Error: Cannot read file '/x.blend': No such file or directory"
        ));
        assert!(is_error_line("Traceback (most recent call last):"));
        assert!(is_error_line(
            "Error in PyDriver: expression failed: int('tessera') + frame"
        ));
        assert!(is_error_line(
            "Cannot save Node File Output to /proc/x/Image0001.png"
        ));
        assert!(!is_error_line("Fra:1 Mem:12.00M | Rendering 1 / 8 samples"));
        assert!(!is_error_line("Saved: '/tmp/frame_0001.png'"));
    }

    #[test]
    fn outputs_must_cover_every_frame() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("frame_0001.png"), b"x").unwrap();
        std::fs::write(dir.path().join("frame_10000.png"), b"y").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"z").unwrap();
        let got = collect_outputs(dir.path(), &[1, 10000]).unwrap();
        assert_eq!(
            got.iter().map(|f| f.frame).collect::<Vec<_>>(),
            vec![1, 10000]
        );
        assert_eq!(got[0].ext, "png");
        let err = collect_outputs(dir.path(), &[1, 2]).unwrap_err();
        assert!(err.contains("[2]"), "{err}");
        std::fs::write(dir.path().join("frame_0003.png"), b"").unwrap();
        assert!(collect_outputs(dir.path(), &[3])
            .unwrap_err()
            .contains("empty image"));
    }
}
