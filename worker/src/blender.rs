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
    /// CUDA on an NVIDIA GPU.
    Cuda,
    /// OptiX on an NVIDIA GPU.
    Optix,
}

impl Device {
    /// Cycles' name for the device type.
    pub fn cycles_name(self) -> &'static str {
        match self {
            Self::Cpu => "CPU",
            Self::Cuda => "CUDA",
            Self::Optix => "OPTIX",
        }
    }

    /// Lowercase name, as in the protocol.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Optix => "optix",
        }
    }

    /// Parses the protocol's name; anything else is the CPU.
    pub fn from_name(s: &str) -> Self {
        match s {
            "cuda" => Self::Cuda,
            "optix" => Self::Optix,
            _ => Self::Cpu,
        }
    }
}

/// The line Blender prints when the Cycles device asked for is not there.
pub const NO_DEVICE: &str = "Found no Cycles device of the specified type";

/// What a render has done so far, read by the lease heartbeat.
#[derive(Debug, Default)]
pub struct Progress {
    /// Frames finished.
    pub frames: AtomicU32,
    /// Samples of the current frame rendered.
    pub samples_done: AtomicU32,
    /// Samples of the current frame in all.
    pub samples_total: AtomicU32,
}

/// One render to do.
#[derive(Debug, Clone)]
pub struct RenderRequest {
    /// The job it belongs to (a warm session serves one job).
    pub job: u64,
    /// The worker slot rendering it.
    pub slot: u32,
    /// The scene file.
    pub scene: PathBuf,
    /// Frames, ascending.
    pub frames: Vec<u32>,
    /// An empty directory for the images.
    pub out_dir: PathBuf,
    /// Render threads (None: Blender's default, all cores).
    pub threads: Option<u32>,
    /// For a tile: the region to render.
    pub tile: Option<TileRender>,
    /// The Cycles device to render with.
    pub device: Device,
    /// The GPU (UUID) Blender is pinned to, when rendering on one.
    pub gpu_uuid: Option<String>,
}

/// Pins a Blender child to one GPU: CUDA and OptiX see only that device.
pub fn pin_gpu(cmd: &mut Command, req: &RenderRequest) {
    if req.device != Device::Cpu {
        if let Some(uuid) = &req.gpu_uuid {
            cmd.env("CUDA_VISIBLE_DEVICES", uuid);
        }
    }
}

/// A tile region to render, as the coordinator computed it.
#[derive(Debug, Clone, PartialEq)]
pub struct TileRender {
    /// Width and height of the rendered region (tile plus overscan).
    pub size: (u32, u32),
    /// The full frame's size, which the scene must still have.
    pub frame: (u32, u32),
    /// Blender's border fractions: min x, max x, min y, max y (y from the bottom).
    pub border: [f64; 4],
}

impl TileRender {
    /// Python run inside Blender before rendering: checks the scene's size and
    /// sets the border, cropped to the region.
    pub fn python(&self) -> String {
        let (fw, fh) = self.frame;
        let [x0, x1, y0, y1] = self.border;
        format!(
            "import bpy\n\
             r = bpy.context.scene.render\n\
             size = (r.resolution_x * r.resolution_percentage // 100, r.resolution_y * r.resolution_percentage // 100)\n\
             if size != ({fw}, {fh}):\n    \
             raise RuntimeError('tessera: the scene renders %dx%d but the job was submitted for {fw}x{fh}; submit it again' % size)\n\
             r.use_border = True\n\
             r.use_crop_to_border = True\n\
             r.border_min_x, r.border_max_x, r.border_min_y, r.border_max_y = {x0:?}, {x1:?}, {y0:?}, {y1:?}\n"
        )
    }
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
        /// Whether it would fail the same way on any worker.
        permanent: bool,
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
        progress: Arc<Progress>,
        stop: watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = Result<Vec<RenderedFrame>, RenderFailure>> + Send;

    /// The job whose Blender session `slot` keeps warm, if any.
    fn warm_job(&self, _slot: u32) -> Option<u64> {
        None
    }

    /// Ends the warm sessions of jobs that are over.
    fn end_jobs(&self, _jobs: &[u64]) {}
}

/// A failure of this render only.
pub fn failure(reason: String, log_tail: String) -> RenderFailure {
    RenderFailure::Failed {
        reason,
        log_tail,
        permanent: false,
    }
}

/// Runs a fresh `blender -b` process per render.
#[derive(Debug, Clone)]
pub struct BlenderProcess {
    /// The Blender executable.
    pub blender: PathBuf,
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
        progress: Arc<Progress>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Vec<RenderedFrame>, RenderFailure> {
        let failed = failure;
        let frames: Vec<String> = req.frames.iter().map(u32::to_string).collect();
        let mut cmd = Command::new(&self.blender);
        cmd.arg("-b")
            .arg(&req.scene)
            .args(["--python-exit-code", PYTHON_EXIT_CODE]);
        if let Some(tile) = &req.tile {
            cmd.arg("--python-expr").arg(tile.python());
        }
        cmd.arg("-o").arg(req.out_dir.join("frame_####"));
        if let Some(t) = req.threads {
            cmd.args(["-t", &t.to_string()]);
        }
        cmd.arg("-f")
            .arg(frames.join(","))
            .args(["--", "--cycles-device", req.device.cycles_name()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        die_with_parent(&mut cmd);
        pin_gpu(&mut cmd, &req);
        let mut child = cmd.spawn().map_err(|e| {
            failed(
                format!("cannot start Blender `{}`: {e}", self.blender.display()),
                String::new(),
            )
        })?;
        let mut line_rx = read_lines(&mut child);
        let mut tail: VecDeque<String> = VecDeque::with_capacity(LOG_TAIL_LINES);
        let mut errors: Vec<String> = Vec::new();
        let mut saved = 0u32;
        let mut python_exception: Option<String> = None;
        let mut status = None;
        let mut lines_open = true;
        let mut stop_open = !*stop.borrow();
        while status.is_none() || lines_open {
            tokio::select! {
                line = line_rx.recv(), if lines_open => match line {
                    Some(line) => {
                        if line.starts_with("Saved: ") {
                            saved += 1;
                            progress.frames.store(saved, Ordering::Relaxed);
                        }
                        if is_error_line(&line) && errors.len() < 5 {
                            errors.push(line.trim().to_string());
                        }
                        if is_python_exception(&line) {
                            python_exception = Some(line.trim().to_string());
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
        if let Some(exc) = python_exception.filter(|e| !errors.contains(e)) {
            errors.push(exc);
        }
        let log_tail = Vec::from(tail).join("\n");
        let summary = summarize(&errors);
        if !status.success() {
            let reason = match &summary {
                Some(e) => format!("Blender failed ({status}): {e}"),
                None => format!("Blender failed ({status})"),
            };
            return Err(failed(reason, log_tail));
        }
        if let Some(e) = summary {
            return Err(failed(
                format!("Blender reported an error although it exited 0: {e}"),
                log_tail,
            ));
        }
        let frames = collect_outputs(&req.out_dir, &req.frames)
            .map_err(|reason| failed(reason, log_tail.clone()))?;
        if let Some(tile) = &req.tile {
            for f in &frames {
                let got = crate::image_size::image_size(&f.path)
                    .map_err(|reason| failed(reason, log_tail.clone()))?;
                if got != tile.size {
                    return Err(failed(
                        format!(
                            "tile of frame {} came out {}x{} but should be {}x{}; Blender rounded the border differently than expected",
                            f.frame, got.0, got.1, tile.size.0, tile.size.1
                        ),
                        log_tail,
                    ));
                }
            }
        }
        Ok(frames)
    }
}

/// Whether a line is the last line of a Python traceback (`ValueError: ...`).
pub fn is_python_exception(line: &str) -> bool {
    let Some((name, _)) = line.split_once(": ") else {
        return false;
    };
    !name.is_empty()
        && !line.starts_with(' ')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && (name.ends_with("Error") || name.ends_with("Exception"))
}

/// One line naming what went wrong: the first error lines, without the
/// uninformative traceback header.
pub fn summarize(errors: &[String]) -> Option<String> {
    let useful: Vec<&str> = errors
        .iter()
        .map(String::as_str)
        .filter(|e| !e.starts_with("Traceback"))
        .take(3)
        .collect();
    match useful.as_slice() {
        [] => errors.first().cloned(),
        lines => Some(lines.join(" | ")),
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
pub fn die_with_parent(cmd: &mut Command) {
    child_setup(cmd, None);
}

/// Prepares a Blender child: it dies with the worker and, when `reply_fd` is
/// given, finds that descriptor (a pipe's write end) as its fd 3.
#[allow(unsafe_code)]
pub fn child_setup(cmd: &mut Command, reply_fd: Option<i32>) {
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (prctl, dup2, fcntl) on plain integers.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if let Some(fd) = reply_fd {
                if fd == 3 {
                    // dup2 onto itself keeps close-on-exec set: clear it.
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Reads a child's stdout and stderr line by line into one channel.
pub fn read_lines(
    child: &mut tokio::process::Child,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let streams: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    .collect();
    for stream in streams {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    rx
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
    fn python_exceptions() {
        assert!(is_python_exception(
            "ValueError: invalid literal for int() with base 10: 'tessera'"
        ));
        assert!(is_python_exception(
            "RuntimeError: tessera: the scene renders 10x10"
        ));
        assert!(!is_python_exception(
            "  File \"<bpy driver>\", line 1, in <module>"
        ));
        assert!(!is_python_exception("Fra:1 Mem:1M | Error: x"));
        let errors = vec![
            "Traceback (most recent call last):".to_string(),
            "ValueError: bad".to_string(),
        ];
        assert_eq!(summarize(&errors).unwrap(), "ValueError: bad");
    }

    #[test]
    fn tile_python_sets_the_border_and_checks_the_size() {
        let t = TileRender {
            size: (97, 76),
            frame: (321, 239),
            border: [0.1, 0.4, 0.5, 0.75],
        };
        let py = t.python();
        assert!(
            py.contains("!= (321, 239)") && py.contains("use_crop_to_border = True"),
            "{py}"
        );
        assert!(py.contains("0.1, 0.4, 0.5, 0.75"), "{py}");
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
