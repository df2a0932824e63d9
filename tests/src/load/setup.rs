//! Getting a coordinator ready for load, as an admin would over gRPC: worker
//! tokens, the scene upload, one big job; and reading a job's tasks back.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tessera_proto as pb;

use super::{blobs, connect, farm, within, LoadError, Target};

/// Workers registered under one worker token: below the coordinator's
/// default `--max-workers-per-token` (1,024), so no flag needs raising.
pub const WORKERS_PER_TOKEN: u32 = 500;

/// The most tasks one `GetJob` page holds.
pub const TASK_PAGE: u32 = 10_000;

/// Makes a tiny real scene with `tests/blender/make_scene.py` at `out`: submit
/// checks that a scene is a whole Blender file.
pub fn make_scene(blender: &Path, out: &Path) -> Result<PathBuf, LoadError> {
    let script = crate::root().join("tests/blender/make_scene.py");
    let result = std::process::Command::new(blender)
        .args([
            "-b",
            "--factory-startup",
            "--python-exit-code",
            "2",
            "--python",
        ])
        .arg(&script)
        .args(["--", "--kind", "still", "--frames", "1", "--out"])
        .arg(out)
        .output()
        .map_err(|e| {
            LoadError::io(
                format!(
                    "cannot run {} (install Blender, or pass --scene with a .blend)",
                    blender.display()
                ),
                e,
            )
        })?;
    if !result.status.success() || !out.is_file() {
        return Err(LoadError::Coordinator(format!(
            "make_scene.py failed; pass --scene with a .blend instead:\n{}",
            String::from_utf8_lossy(&result.stdout)
        )));
    }
    Ok(out.to_path_buf())
}

/// Adds `count` worker users (named `load-NONCE-I`) and returns their tokens.
pub async fn worker_tokens(target: &Target, count: u32) -> Result<Vec<String>, LoadError> {
    let mut client = farm(connect(&target.url, &target.admin_token)?);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let mut tokens = Vec::new();
    for i in 0..count {
        let name = format!("load-{nonce}-{i}");
        let user = client
            .add_user(pb::AddUserRequest {
                name: name.clone(),
                role: "worker".into(),
            })
            .await
            .map_err(|s| LoadError::rpc(format!("adding worker user {name}"), s))?;
        tokens.push(user.into_inner().token);
    }
    Ok(tokens)
}

/// Uploads `bytes` as one blob (with `token`); returns its digest.
pub async fn put_blob(url: &str, token: &str, bytes: Vec<u8>) -> Result<String, LoadError> {
    let digest = blake3::hash(&bytes).to_hex().to_string();
    let chunk = pb::BlobChunk {
        digest: digest.clone(),
        size: bytes.len() as u64,
        data: bytes,
    };
    blobs(connect(url, token)?)
        .put_blob(tokio_stream::iter([chunk]))
        .await
        .map_err(|s| LoadError::rpc("uploading the scene", s))?;
    Ok(digest)
}

/// Submits one job of `tasks` single-frame tasks (frames `1-tasks`) of the
/// uploaded scene `scene`; returns its id and how long the submit took.
pub async fn submit(
    target: &Target,
    scene: &str,
    tasks: u32,
    limit: Duration,
) -> Result<(u64, Duration), LoadError> {
    let mut client = farm(connect(&target.url, &target.admin_token)?);
    let spec = pb::JobSpec {
        scene_digest: scene.to_string(),
        scene_name: "tessera-load.blend".into(),
        frames: format!("1-{tasks}"),
        chunk: 1,
        ..Default::default()
    };
    let start = Instant::now();
    let id = within(&format!("submitting a {tasks}-task job"), limit, async {
        client
            .submit_job(spec)
            .await
            .map_err(|s| LoadError::rpc(format!("submitting a {tasks}-task job"), s))
    })
    .await?
    .into_inner()
    .job_id;
    Ok((id, start.elapsed()))
}

/// The state of every task of `job`, by index, read page by page with
/// `GetJob`. A coordinator that ignores paging and answers with every task
/// at once is read the same way.
pub async fn task_states(target: &Target, job: u64) -> Result<Vec<pb::TaskState>, LoadError> {
    let mut client = farm(connect(&target.url, &target.admin_token)?);
    let mut states: Vec<Option<pb::TaskState>> = Vec::new();
    let mut from = 0u32;
    loop {
        let view = client
            .get_job(pb::JobRef {
                job_id: job,
                task_from: from,
                task_limit: TASK_PAGE,
                ..Default::default()
            })
            .await
            .map_err(|s| LoadError::rpc(format!("reading tasks of job {job} from {from}"), s))?
            .into_inner();
        states.resize(view.tasks_total as usize, None);
        let mut next = from;
        for t in view.tasks.iter().filter(|t| t.index >= from) {
            let slot = states.get_mut(t.index as usize).ok_or_else(|| {
                LoadError::Coordinator(format!(
                    "job {job} has {} tasks but lists task {}",
                    view.tasks_total, t.index
                ))
            })?;
            *slot = Some(t.state());
            next = next.max(t.index + 1);
        }
        if next == from || next >= view.tasks_total {
            break;
        }
        from = next;
    }
    states
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.ok_or_else(|| LoadError::Coordinator(format!("job {job}: no page listed task {i}")))
        })
        .collect()
}
