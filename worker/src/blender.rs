//! What renders are asked for and what comes back, the [`Renderer`] trait,
//! and reading Blender's output.
//!
//! Blender exits 0 on many failures (Python errors, missing textures), so the
//! session that runs it ([`crate::session`]) watches its output for error
//! lines, and every frame is checked ([`crate::verify`]) before it counts.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

use crate::error::Error;
use crate::failure::{classify, Kind, Scope};

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
    /// The job's root, when it has a file set: the scene reads files under
    /// it only, and its absolute references are rewritten into it.
    pub root: Option<crate::fileset::JobRoot>,
    /// The version of the worker's Blender runtime to render with, as the
    /// coordinator chose it (None: the first).
    pub blender: Option<String>,
    /// The coordinator's pixel limit (`--max-pixels` W, H), if it sent one.
    pub max_pixels: Option<(u32, u32)>,
    /// Run the scene's stored Python (auto-run): the job asked for it and
    /// this worker allows it (see [`crate::isolation::blender_flags`]).
    pub scene_python: bool,
}

/// Pins a Blender child to one GPU: CUDA and OptiX see only that device.
pub fn pin_gpu(cmd: &mut Command, device: Device, gpu_uuid: Option<&str>) {
    if device != Device::Cpu {
        if let Some(uuid) = gpu_uuid {
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

/// A rendered image, checked to be what Blender rendered for this task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedFrame {
    /// Frame number.
    pub frame: u32,
    /// The image file.
    pub path: PathBuf,
    /// Its extension without the dot.
    pub ext: String,
    /// Extra outputs of the frame (File Output nodes), checked and fresh.
    pub passes: Vec<PassFile>,
    /// What the job should know about how it was rendered (stored Python
    /// that did not run, see [`crate::scene_python`]).
    pub warnings: Vec<String>,
}

/// One extra output of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassFile {
    /// Its name relative to the task's passes folder ([`crate::passes`]).
    pub name: String,
    /// The file.
    pub path: PathBuf,
}

/// Why a render did not produce its frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderFailure {
    /// Blender failed; the reason and the tail of its log.
    Failed {
        /// What went wrong, in Blender's words, and what to do.
        reason: String,
        /// The last lines Blender printed.
        log_tail: String,
        /// Who could render it instead.
        scope: Scope,
    },
    /// The render was stopped on request.
    Stopped,
    /// The worker cannot hold what the task needs (its cache's disk is
    /// full even after eviction): the task is given back, uncharged.
    NoRoom(String),
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

    /// Readies `slot`, which renders on `device` (pinned to the GPU
    /// `gpu_uuid`), before any task arrives: a renderer may start Blender.
    fn prepare(&self, _slot: u32, _device: Device, _gpu_uuid: Option<&str>) {}

    /// Readies `slot` for its next task, of another job than the one it
    /// renders now (leased ahead): a renderer may start the Blender that
    /// task will need (`next` says how) while the current render runs.
    fn expect(&self, _slot: u32, _next: &NextLaunch) {}
}

/// How a slot's next task, leased ahead, will run Blender.
#[derive(Debug, Clone)]
pub struct NextLaunch {
    /// The device the slot renders on.
    pub device: Device,
    /// The GPU the slot is pinned to.
    pub gpu_uuid: Option<String>,
    /// The Blender version the task names (`None`: the worker's first).
    pub blender: Option<String>,
    /// Whether the task runs the scene's stored Python.
    pub scene_python: bool,
}

/// A failure of `kind`: `what` happened, Blender printed `words` (its error
/// lines); classified into a scope, with the fix added to the reason.
pub fn failure(kind: Kind, what: String, words: &str, log_tail: String) -> RenderFailure {
    let d = classify(kind, &what, words);
    RenderFailure::Failed {
        reason: d.reason,
        log_tail,
        scope: d.scope,
    }
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

/// Most bytes of memory each Blender may allocate; 0: no limit.
static MEMORY_LIMIT: AtomicU64 = AtomicU64::new(0);

/// Limits the memory of every Blender started from now on to `bytes`
/// (0: no limit), so a scene that decompresses or allocates without bound
/// (a gzip or zstd bomb) fails alone instead of exhausting the machine.
/// It is RLIMIT_DATA, not RLIMIT_AS: GPU drivers reserve address space far
/// past what they use, which RLIMIT_AS would count and refuse.
pub fn set_memory_limit(bytes: u64) {
    MEMORY_LIMIT.store(bytes, Ordering::Relaxed);
}

/// The limit [`set_memory_limit`] set.
pub fn memory_limit() -> u64 {
    MEMORY_LIMIT.load(Ordering::Relaxed)
}

/// Prepares a Blender child: it dies with the worker, its memory is limited
/// by [`set_memory_limit`] and, when `reply_fd` is given, it finds that
/// descriptor (a pipe's write end) as its fd 3.
#[allow(unsafe_code)]
pub fn child_setup(cmd: &mut Command, reply_fd: Option<i32>) {
    let memory = memory_limit();
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (prctl, setrlimit, dup2, fcntl) on plain
    // integers.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if memory > 0 {
                let limit = libc::rlimit {
                    rlim_cur: memory,
                    rlim_max: memory,
                };
                if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
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
    fn a_summary_leaves_out_the_traceback_header() {
        let errors = vec![
            "Traceback (most recent call last):".to_string(),
            "ValueError: bad".to_string(),
        ];
        assert_eq!(summarize(&errors).unwrap(), "ValueError: bad");
    }
}
