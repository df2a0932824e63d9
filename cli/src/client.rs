//! Talking to a coordinator as a user: friendly errors, job pages, waiting
//! with a progress bar, downloads. Uploads are [`crate::upload`]'s; this
//! module knows nothing of scenes, file sets or commands.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tessera_proto as pb;
use tessera_worker::connect::{Access, Conn};
use tonic::Code;

use tessera_worker::{connect, transfer};

/// The largest reply the CLI decodes (a page of 10,000 tasks with failure
/// messages of up to 10 KB fits).
pub const MAX_MESSAGE: usize = 128 << 20;

/// Tasks shown by `status` (and in `status --json`).
pub const STATUS_TASKS: u32 = 1000;

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
        let channel = connect::channel(access)?;
        Ok(Self {
            url: access.url.clone(),
            // Pages are capped by the coordinator; this leaves room for
            // long failure messages in a page of 10,000 tasks.
            farm: pb::farm_client::FarmClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE),
            blobs: pb::blobs_client::BlobsClient::new(channel),
        })
    }

    /// Turns a status into an error that says what to do.
    pub fn explain(&self, s: tonic::Status) -> anyhow::Error {
        let standby = s
            .metadata()
            .get(tessera_worker::failover::ROLE_HEADER)
            .is_some_and(|v| v.as_encoded_bytes() == b"standby");
        match s.code() {
            // A standby (or a coordinator that stepped down) says who is
            // active, or what is down, itself.
            Code::Unavailable if standby => anyhow!("{}: {}", self.url, s.message()),
            // The coordinator answered: its own words say what is wrong.
            Code::Unavailable if s.message().contains("PostgreSQL") => {
                anyhow!("{}: {}", self.url, s.message())
            }
            Code::Unavailable => anyhow!(
                "cannot reach the coordinator at {}: {}; start one with `tessera coordinator` or point --coordinator (or $TESSERA_COORDINATOR) at it",
                self.url,
                s.message()
            ),
            // Failover's words name the silent address and the next one.
            Code::DeadlineExceeded => anyhow!(
                "{}; check that the coordinator runs and is reachable, or list every coordinator in --coordinator a,b",
                s.message()
            ),
            _ => anyhow!("{}", s.message()),
        }
    }

    /// One job's summary with its first tasks (up to [`STATUS_TASKS`]).
    pub async fn job(&mut self, id: u64) -> Result<pb::JobView> {
        self.job_page(pb::JobRef {
            job_id: id,
            task_limit: STATUS_TASKS,
            ..Default::default()
        })
        .await
    }

    /// One job with the page `r` asks for.
    pub async fn job_page(&mut self, r: pb::JobRef) -> Result<pb::JobView> {
        let r = self.farm.get_job(r).await;
        r.map(tonic::Response::into_inner)
            .map_err(|s| self.explain(s))
    }

    /// Every output of job `id`, fetched a page at a time.
    pub async fn outputs(&mut self, id: u64) -> Result<Vec<pb::FrameOutput>> {
        const PAGE: u32 = 10_000;
        let mut all = Vec::new();
        loop {
            let page = self
                .job_page(pb::JobRef {
                    job_id: id,
                    output_from: all.len() as u32,
                    output_limit: PAGE,
                    ..Default::default()
                })
                .await?;
            let n = page.outputs.len();
            all.extend(page.outputs);
            if n < PAGE as usize || all.len() >= page.outputs_total as usize {
                return Ok(all);
            }
        }
    }

    /// Every job's summary (archived ones too with `archived`), a page at a time.
    pub async fn jobs(&mut self, archived: bool) -> Result<Vec<pb::JobView>> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let r = self
                .farm
                .list_jobs(pb::ListJobsRequest {
                    limit: 1000,
                    after,
                    archived,
                })
                .await
                .map_err(|s| self.explain(s))?
                .into_inner();
            all.extend(r.jobs);
            if r.next_after == 0 {
                return Ok(all);
            }
            after = r.next_after;
        }
    }
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
    if job.samples_total == 0 {
        String::new()
    } else {
        format!(", {}/{} samples", job.samples_done, job.samples_total)
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
    u64::from(job.frames_done) + u64::from(job.running_frames_done)
}

/// Rendered frames of a job (its extra outputs, passes, left out).
pub fn frame_count(job: &pb::JobView) -> usize {
    job.frames_done as usize
}

/// Waits for a job to end, drawing a progress bar from the coordinator's
/// stream of changes. Tolerates the coordinator going away for a while (it
/// may be restarting): the stream is opened again, and starts with the job
/// as it is then. Fails unless the job is done.
pub async fn wait(client: &mut Client, id: u64) -> Result<pb::JobView> {
    use tokio_stream::StreamExt;
    let mut bar: Option<ProgressBar> = None;
    let mut unreachable_since: Option<std::time::Instant> = None;
    loop {
        let opened = client
            .farm
            .watch_job(pb::JobRef {
                job_id: id,
                ..Default::default()
            })
            .await;
        let failure = match opened {
            Ok(r) => {
                let mut stream = r.into_inner();
                loop {
                    match stream.next().await {
                        Some(Ok(event)) => {
                            unreachable_since = None;
                            let Some(job) = event.job else { continue };
                            if let Some(done) = show_progress(&mut bar, job, id)? {
                                return Ok(done);
                            }
                        }
                        Some(Err(s)) => break s,
                        // The stream ends only after the job ended, which
                        // the last event said; a cut connection lands here too.
                        None => break tonic::Status::unavailable("the event stream ended"),
                    }
                }
            }
            Err(s) => s,
        };
        if !connect::transient(&failure) {
            return Err(client.explain(failure));
        }
        let since = *unreachable_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() > Duration::from_secs(300) {
            return Err(client.explain(failure)).context(format!("gave up waiting for job {id}"));
        }
        if let Some(b) = &bar {
            b.set_message("coordinator unreachable; retrying");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Shows one state of job `id` on the bar; returns the job once it is done,
/// and fails when it failed or was canceled.
fn show_progress(
    bar: &mut Option<ProgressBar>,
    job: pb::JobView,
    id: u64,
) -> Result<Option<pb::JobView>> {
    let b = bar.get_or_insert_with(|| bar_for(&job));
    b.set_position(frames_done(&job));
    let running = job.tasks_running;
    b.set_message(match pb::JobState::try_from(job.state) {
        Ok(pb::JobState::Queued) if !job.waiting.is_empty() => job.waiting.clone(),
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
            Ok(Some(job))
        }
        Ok(pb::JobState::Failed) => {
            b.abandon_with_message("failed");
            bail!("job {id} failed: {}", job.message);
        }
        Ok(pb::JobState::Canceled) => {
            b.abandon_with_message("canceled");
            bail!("job {id} was canceled");
        }
        _ => Ok(None),
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
    fetch_from(client, job, dir, Source::Farm).await
}

/// Where [`fetch_from`] takes a job's files.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// Downloaded from the coordinator (verified against their digests).
    Farm,
    /// Taken from the blob directory of a coordinator in this process
    /// (`tessera render`), whose uploads it verified: hard-linked when
    /// `link` (a directory deleted when the render ends, so the frame is
    /// not shared with a store that lives on) and on the same volume, else
    /// copied by the kernel.
    Local { blobs: &'a Path, link: bool },
}

/// [`fetch`] from `source`.
pub async fn fetch_from(
    client: &mut Client,
    job: &pb::JobView,
    dir: &Path,
    source: Source<'_>,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let outputs = client.outputs(job.id).await?;
    let mut frames = Vec::with_capacity(outputs.len());
    let mut passes = Vec::new();
    for out in &outputs {
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
        let what = || match out.pass.as_str() {
            "" => format!("cannot download frame {}", out.frame),
            p => format!("cannot download {p} of frame {}", out.frame),
        };
        let local = match source {
            Source::Farm => false,
            Source::Local { blobs, link } => out
                .digest
                .parse()
                .map(|d| tessera_coordinator::blobs::blob_path(blobs, &d))
                .is_ok_and(|from| deliver(&from, &path, link).is_ok()),
        };
        // Not in place (still waiting for the commit that makes it durable):
        // the coordinator serves it wherever it is.
        if !local {
            transfer::download_file(&mut client.blobs, &out.digest, &path)
                .await
                .map_err(|e| match e {
                    tessera_worker::Error::Rpc(s) => client.explain(s),
                    other => anyhow!(other),
                })
                .with_context(what)?;
        }
        if out.pass.is_empty() {
            frames.push(path);
        } else {
            passes.push(path);
        }
    }
    Ok((frames, passes))
}

/// Puts the stored file `from` at `to`: a hard link when `link` allows and
/// both are on one volume, else a copy (`copy_file_range` on Linux: the
/// bytes do not pass through this process).
fn deliver(from: &Path, to: &Path, link: bool) -> std::io::Result<()> {
    if !from.is_file() {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    match std::fs::remove_file(to) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    if link && std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to).map(drop)
}
