//! Talking to a coordinator as a user: friendly errors, uploads, waiting with
//! a progress bar, downloads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tessera_proto as pb;
use tessera_worker::agent::{Access, Conn};
use tonic::Code;

use tessera_coordinator::blendfile;
use tessera_coordinator::frames::FrameSet;
use tessera_worker::{agent, transfer};

/// Clients of one coordinator.
#[derive(Clone)]
pub struct Client {
    /// The coordinator's URL, for messages.
    pub url: String,
    /// Jobs and workers.
    pub farm: pb::farm_client::FarmClient<Conn>,
    /// Blobs.
    pub blobs: pb::blobs_client::BlobsClient<Conn>,
}

impl Client {
    /// A client of the coordinator at `url` (connects on first use).
    pub fn new(access: &Access) -> Result<Self> {
        let channel = agent::channel(access)?;
        Ok(Self {
            url: access.url.clone(),
            farm: pb::farm_client::FarmClient::new(channel.clone()),
            blobs: pb::blobs_client::BlobsClient::new(channel),
        })
    }

    /// Turns a status into an error that says what to do.
    pub fn explain(&self, s: tonic::Status) -> anyhow::Error {
        match s.code() {
            Code::Unavailable => anyhow!(
                "cannot reach the coordinator at {}: {}; start one with `tessera coordinator` or point --coordinator (or $TESSERA_COORDINATOR) at it",
                self.url,
                s.message()
            ),
            _ => anyhow!("{}", s.message()),
        }
    }

    /// Uploads `bytes` as blob `digest`.
    pub async fn put_bytes(&mut self, digest: &str, bytes: Vec<u8>) -> Result<()> {
        let size = bytes.len() as u64;
        let chunk = pb::BlobChunk {
            digest: digest.to_string(),
            size,
            data: bytes,
        };
        self.blobs
            .put_blob(tokio_stream::iter(vec![chunk]))
            .await
            .map_err(|s| self.explain(s))?;
        Ok(())
    }

    /// One job.
    pub async fn job(&mut self, id: u64) -> Result<pb::JobView> {
        let r = self.farm.get_job(pb::JobRef { job_id: id }).await;
        r.map(tonic::Response::into_inner)
            .map_err(|s| self.explain(s))
    }
}

/// Checks that `path` is a Blender file, by its header.
pub fn check_scene(path: &Path) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)
        .with_context(|| format!("cannot open scene {}", path.display()))?;
    let mut head = Vec::with_capacity(12);
    (&mut file)
        .take(12)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot read scene {}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut tail = Vec::with_capacity(blendfile::TAIL);
    file.seek(SeekFrom::Start(size.saturating_sub(blendfile::TAIL as u64)))
        .and_then(|_| file.read_to_end(&mut tail))
        .with_context(|| format!("cannot read scene {}", path.display()))?;
    blendfile::check_end(&head, &tail).map_err(|e| anyhow!("{} {e}", path.display()))?;
    Ok(())
}

/// What the CLI reads from a scene with Blender.
#[derive(Debug, Clone)]
pub struct SceneFacts {
    /// The frame range in frame-set syntax (`1-250`, `1-250x2`).
    pub frames: String,
    /// Output size, resolution percentage applied.
    pub width: u32,
    /// Output height.
    pub height: u32,
    /// Blender's output format name (`PNG`, `OPEN_EXR`, ...).
    pub file_format: String,
}

impl From<&crate::fileset::Facts> for SceneFacts {
    fn from(f: &crate::fileset::Facts) -> Self {
        Self {
            frames: match f.frame_step {
                0 | 1 => format!("{}-{}", f.frame_start, f.frame_end),
                s => format!("{}-{}x{s}", f.frame_start, f.frame_end),
            },
            width: f.width,
            height: f.height,
            file_format: f.file_format.clone(),
        }
    }
}

/// Validates the frame set here, for an early and clear error.
pub fn check_frames(frames: &str) -> Result<()> {
    FrameSet::check(frames)
        .map(drop)
        .map_err(|e| anyhow!("{e}"))
}

/// A progress bar for a job, on stderr.
fn bar(total: u64) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40.cyan/blue} {pos}/{len} frames  {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// Sample progress of the renders in flight, as ` (12/64 samples)`.
pub fn samples(job: &pb::JobView) -> String {
    let running = job
        .tasks
        .iter()
        .filter(|t| t.state == pb::TaskState::Leased as i32 && t.samples_total > 0);
    let (done, total) = running.fold((0u64, 0u64), |(d, t), task| {
        (
            d + u64::from(task.samples_done),
            t + u64::from(task.samples_total),
        )
    });
    if total == 0 {
        String::new()
    } else {
        format!(", {done}/{total} samples")
    }
}

/// Whether the job renders tiles (progress then counts tiles).
fn tiled(job: &pb::JobView) -> bool {
    !job.tiles.is_empty() && job.tiles != "1x1"
}

/// Units finished: tiles for tiled jobs, else frames (counting frames
/// reported by running tasks).
fn frames_done(job: &pb::JobView) -> u64 {
    if tiled(job) {
        return u64::from(job.tasks_done);
    }
    let running: u32 = job
        .tasks
        .iter()
        .filter(|t| t.state == pb::TaskState::Leased as i32)
        .map(|t| t.frames_done)
        .sum();
    frame_count(job) as u64 + u64::from(running)
}

/// Rendered frames of a job (its extra outputs, passes, left out).
pub fn frame_count(job: &pb::JobView) -> usize {
    job.outputs.iter().filter(|o| o.pass.is_empty()).count()
}

/// Waits for a job to end, drawing a progress bar. Tolerates the coordinator
/// going away for a while (it may be restarting). Fails unless the job is done.
pub async fn wait(client: &mut Client, id: u64) -> Result<pb::JobView> {
    let mut bar: Option<ProgressBar> = None;
    let mut unreachable_since: Option<std::time::Instant> = None;
    loop {
        match client.farm.get_job(pb::JobRef { job_id: id }).await {
            Ok(r) => {
                unreachable_since = None;
                let job = r.into_inner();
                let b = bar.get_or_insert_with(|| bar_for(&job));
                b.set_position(frames_done(&job));
                let running = job.tasks_running;
                b.set_message(match pb::JobState::try_from(job.state) {
                    Ok(pb::JobState::Queued) => "queued".to_string(),
                    Ok(pb::JobState::Running) => {
                        format!("running on {running} slot(s){}", samples(&job))
                    }
                    Ok(s) => s
                        .as_str_name()
                        .trim_start_matches("JOB_STATE_")
                        .to_lowercase(),
                    Err(_) => String::new(),
                });
                match pb::JobState::try_from(job.state) {
                    Ok(pb::JobState::Done) => {
                        b.finish_with_message("done");
                        return Ok(job);
                    }
                    Ok(pb::JobState::Failed) => {
                        b.abandon_with_message("failed");
                        bail!("job {id} failed: {}", job.message);
                    }
                    Ok(pb::JobState::Canceled) => {
                        b.abandon_with_message("canceled");
                        bail!("job {id} was canceled");
                    }
                    _ => {}
                }
            }
            Err(s) if agent::transient(&s) => {
                let since = *unreachable_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > Duration::from_secs(300) {
                    return Err(client.explain(s)).context(format!("gave up waiting for job {id}"));
                }
                if let Some(b) = &bar {
                    b.set_message("coordinator unreachable; retrying");
                }
            }
            Err(s) => return Err(client.explain(s)),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn bar_for(job: &pb::JobView) -> ProgressBar {
    if tiled(job) {
        let b = bar(u64::from(job.tasks_total));
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40.cyan/blue} {pos}/{len} tiles  {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        return b;
    }
    bar(u64::from(job.frames_total))
}

/// The file name of a frame: `frame_0001.png`.
pub fn frame_file(frame: u32, ext: &str) -> String {
    format!("frame_{frame:04}.{ext}")
}

/// Tells how many extra outputs were written, and where.
pub fn say_passes(passes: &[PathBuf], dir: &Path) {
    if !passes.is_empty() {
        eprintln!(
            "{} extra output(s) (File Output passes) written to {}",
            passes.len(),
            dir.join("passes").display()
        );
    }
}

/// Downloads every rendered frame of `job` into `dir`, and every extra output
/// (a File Output node's pass) under `dir/passes/`; returns the frames' paths
/// and the passes' paths.
pub async fn fetch(
    client: &mut Client,
    job: &pb::JobView,
    dir: &Path,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut frames = Vec::with_capacity(job.outputs.len());
    let mut passes = Vec::new();
    for out in &job.outputs {
        let ext = if !out.ext.is_empty() && out.ext.bytes().all(|b| b.is_ascii_alphanumeric()) {
            out.ext.as_str()
        } else {
            "bin"
        };
        let path = if out.pass.is_empty() {
            dir.join(frame_file(out.frame, ext))
        } else {
            // The name comes from the scene: checked before it names a file.
            let path = tessera_worker::passes::destination(dir, &out.pass)
                .map_err(|e| anyhow!("the coordinator sent a bad extra output: {e}"))?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("cannot create {}", parent.display()))?;
            }
            path
        };
        transfer::download_file(&mut client.blobs, &out.digest, &path)
            .await
            .map_err(|e| match e {
                tessera_worker::Error::Rpc(s) => client.explain(s),
                other => anyhow!(other),
            })
            .with_context(|| match out.pass.as_str() {
                "" => format!("cannot download frame {}", out.frame),
                p => format!("cannot download {p} of frame {}", out.frame),
            })?;
        if out.pass.is_empty() {
            frames.push(path);
        } else {
            passes.push(path);
        }
    }
    Ok((frames, passes))
}
