//! Preview videos from the command line: `tessera preview JOB` asks the
//! coordinator for a done job's video, waits for it and downloads it;
//! `tessera fetch JOB --preview` downloads one that is ready.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tessera_proto as pb;
use tessera_worker::connect::Access;
use tessera_worker::transfer;

use crate::client::{self, Client};

/// How long `tessera preview` waits for the coordinator to make a video
/// (the coordinator stops ffmpeg sooner, after its --preview-timeout).
const MAX_WAIT: Duration = Duration::from_secs(3 * 3600);

/// How often `tessera preview` asks whether the video is ready.
const POLL: Duration = Duration::from_millis(300);

/// The line `tessera status` shows for a job's preview; None when none was
/// asked for.
pub fn status_line(j: &pb::JobView) -> Option<String> {
    let p = j.preview.as_ref()?;
    let done = j.state == pb::JobState::Done as i32;
    Some(match p.state.as_str() {
        "ready" => {
            let mut line = format!(
                "ready: {} frames, {}x{} at {} fps, {} bytes (`tessera fetch {} --preview`)",
                p.frames, p.width, p.height, p.fps, p.size, j.id
            );
            if !p.message.is_empty() {
                line.push_str(&format!("; {}", p.message));
            }
            line
        }
        "failed" => format!("failed: {}", p.message),
        "pending" if done => format!("being made (at {} fps)", p.fps),
        "pending" => format!("made when the job is done (at {} fps)", p.fps),
        other => other.to_string(),
    })
}

/// Where the video goes: `output`, or `job-N-preview.mp4` in it when it is
/// a folder, or in the current folder when none is given.
fn destination(job: u64, output: Option<PathBuf>) -> PathBuf {
    let name = format!("job-{job}-preview.mp4");
    match output {
        Some(p) if p.is_dir() => p.join(name),
        Some(p) => p,
        None => PathBuf::from(name),
    }
}

/// Downloads job `j`'s ready preview to `path`.
async fn download(c: &mut Client, j: &pb::JobView, path: &Path) -> Result<()> {
    let p = j
        .preview
        .as_ref()
        .ok_or_else(|| anyhow!("job {} has no preview video", j.id))?;
    if let Some(parent) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    transfer::download_file(&mut c.blobs, &p.digest, path)
        .await
        .map_err(|e| match e {
            tessera_worker::Error::Rpc(s) => c.explain(s),
            other => anyhow!(other),
        })
        .with_context(|| format!("cannot download the preview of job {}", j.id))?;
    eprintln!(
        "preview of job {} ({} frames, {}x{} at {} fps) written to {}",
        j.id,
        p.frames,
        p.width,
        p.height,
        p.fps,
        path.display()
    );
    if !p.message.is_empty() {
        eprintln!("note: {}", p.message);
    }
    Ok(())
}

/// `tessera fetch JOB --preview [-o FILE]`.
pub async fn fetch(url: &Access, job: u64, output: Option<PathBuf>) -> Result<()> {
    let mut c = Client::new(url)?;
    let j = c.job_page(summary(job)).await?;
    match j.preview.as_ref().map(|p| p.state.as_str()) {
        Some("ready") => download(&mut c, &j, &destination(job, output)).await,
        Some("failed") => bail!(
            "job {job}'s preview could not be made: {}",
            j.preview.as_ref().map_or("", |p| p.message.as_str())
        ),
        Some(_) => bail!(
            "job {job}'s preview is not made yet ({}); `tessera preview {job}` waits for it and downloads it",
            status_line(&j).unwrap_or_default()
        ),
        None => bail!(
            "job {job} has no preview video; `tessera preview {job}` makes one (or submit with --preview)"
        ),
    }
}

/// `tessera preview JOB [-o FILE]`: asks for the video, waits for the job
/// and the video, and downloads it. Fails when the video cannot be made.
pub async fn make(url: &Access, job: u64, output: Option<PathBuf>) -> Result<()> {
    let mut c = Client::new(url)?;
    let j = c
        .farm
        .make_preview(summary(job))
        .await
        .map_err(|s| c.explain(s))?
        .into_inner();
    if j.state != pb::JobState::Done as i32 {
        eprintln!(
            "job {job} is {}; its preview is made when it is done",
            tessera_proto::json::job_state(j.state)
        );
        client::wait(&mut c, job).await?;
    }
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {msg}",
    )?);
    spinner.set_message(format!(
        "making the preview of job {job} (ffmpeg on the coordinator)"
    ));
    spinner.enable_steady_tick(Duration::from_millis(200));
    let started = Instant::now();
    let j = loop {
        let j = c.job_page(summary(job)).await?;
        match j.preview.as_ref().map(|p| p.state.as_str()) {
            Some("ready") | Some("failed") => break j,
            Some(_) if started.elapsed() < MAX_WAIT => tokio::time::sleep(POLL).await,
            Some(_) => {
                spinner.abandon();
                bail!("gave up waiting for job {job}'s preview after {} s; `tessera status {job}` shows how it is going", MAX_WAIT.as_secs())
            }
            None => {
                spinner.abandon();
                bail!("the coordinator forgot that job {job}'s preview was asked for; try `tessera preview {job}` again")
            }
        }
    };
    spinner.finish_and_clear();
    let p = j.preview.as_ref().expect("the loop ends on a preview");
    if p.state == "failed" {
        bail!(
            "job {job}'s preview could not be made: {}; the job and its frames are fine (`tessera fetch {job} -o DIR`)",
            p.message
        );
    }
    download(&mut c, &j, &destination(job, output)).await
}

/// A reference to job `id`'s summary.
fn summary(id: u64) -> pb::JobRef {
    pb::JobRef {
        job_id: id,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_says_where_the_preview_is() {
        let mut j = pb::JobView {
            id: 4,
            state: pb::JobState::Running as i32,
            ..Default::default()
        };
        assert_eq!(status_line(&j), None);
        j.preview = Some(pb::PreviewView {
            state: "pending".into(),
            fps: 12.0,
            ..Default::default()
        });
        assert_eq!(
            status_line(&j).unwrap(),
            "made when the job is done (at 12 fps)"
        );
        j.preview = Some(pb::PreviewView {
            state: "failed".into(),
            message: "ffmpeg could not be started".into(),
            ..Default::default()
        });
        assert!(status_line(&j).unwrap().starts_with("failed: ffmpeg"));
        j.preview = Some(pb::PreviewView {
            state: "ready".into(),
            frames: 12,
            width: 64,
            height: 48,
            fps: 12.0,
            size: 999,
            ..Default::default()
        });
        let line = status_line(&j).unwrap();
        assert!(line.contains("12 frames, 64x48 at 12 fps"), "{line}");
        assert!(line.contains("tessera fetch 4 --preview"), "{line}");
    }

    #[test]
    fn the_video_goes_into_a_folder_or_under_the_name_given() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            destination(3, Some(dir.path().to_path_buf())),
            dir.path().join("job-3-preview.mp4")
        );
        assert_eq!(
            destination(3, Some(PathBuf::from("x/out.mp4"))),
            PathBuf::from("x/out.mp4")
        );
        assert_eq!(destination(3, None), PathBuf::from("job-3-preview.mp4"));
    }
}
