//! One function per subcommand.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use tessera_proto as pb;

use crate::client::{self, Client};
use crate::fileset;
pub use crate::serve::render_mode;
use crate::serve::{coordinator, worker};
use crate::{
    show, BlenderCommand, Cli, Command, DoctorArgs, DoctorSide, JobArgs, SubmitArgs, UsersCommand,
};
use tessera_worker::agent::Access;

/// Where the CLI looks for a token when neither --token nor $TESSERA_TOKEN is set.
pub fn token_file() -> Option<std::path::PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".config"))
        })?;
    Some(base.join("tessera").join("token"))
}

/// The coordinator's address, token and CA from the command line, the
/// environment and the config file.
pub fn access(url: &str, token: Option<String>, ca: Option<&std::path::Path>) -> Result<Access> {
    let token = token.filter(|t| !t.trim().is_empty()).or_else(|| {
        let path = token_file()?;
        let t = std::fs::read_to_string(path).ok()?;
        Some(t.trim().to_string()).filter(|t| !t.is_empty())
    });
    let ca = match ca {
        Some(p) => Some(
            std::fs::read(p)
                .with_context(|| format!("cannot read the CA certificate {}", p.display()))?,
        ),
        None => None,
    };
    Ok(Access {
        url: url.to_string(),
        token,
        ca,
    })
}

async fn users(url: &Access, cmd: UsersCommand) -> Result<()> {
    let mut c = Client::new(url)?;
    match cmd {
        UsersCommand::Add { name, role } => {
            let r = c
                .farm
                .add_user(pb::AddUserRequest { name, role })
                .await
                .map_err(|s| c.explain(s))?
                .into_inner();
            eprintln!("user {} added; its token (shown once):", r.name);
            println!("{}", r.token);
        }
        UsersCommand::List { json } => {
            let users = c
                .farm
                .list_users(pb::ListUsersRequest {})
                .await
                .map_err(|s| c.explain(s))?
                .into_inner()
                .users;
            if json {
                let v: Vec<_> = users.iter().map(|u| serde_json::json!({"name": u.name, "role": u.role, "created_ms": u.created_ms})).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for u in users {
                    println!("{:<24} {}", u.name, u.role);
                }
            }
        }
        UsersCommand::Remove { name } => {
            c.farm
                .remove_user(pb::RemoveUserRequest { name: name.clone() })
                .await
                .map_err(|s| c.explain(s))?;
            eprintln!("user {name} removed; its token no longer works");
        }
    }
    Ok(())
}

/// Whether `--token` was given as an argument rather than by the environment
/// or a file.
pub fn token_on_command_line() -> bool {
    std::env::args().any(|a| a == "--token" || a.starts_with("--token="))
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<()> {
    let url = access(&cli.coordinator, cli.token.clone(), cli.ca.as_deref())?;
    if token_on_command_line() && !matches!(cli.command, Command::Worker(_)) {
        // The worker says so in its log, with its own advice (--token-file).
        eprintln!("warning: the token is on the command line, where any process on this machine can read it (/proc/PID/cmdline); set $TESSERA_TOKEN or put it in ~/.config/tessera/token");
    }
    let one_shot = !matches!(
        cli.command,
        Command::Coordinator(_) | Command::Worker(_) | Command::Hash { .. } | Command::Render(_)
    );
    if one_shot {
        // Several coordinator addresses: start with the active one.
        crate::ha::find_active(&url).await;
    }
    match cli.command {
        Command::Coordinator(args) if args.status => crate::ha::status(&url).await,
        Command::Coordinator(args) => coordinator(args).await,
        Command::Worker(args) => worker(&url, args).await,
        Command::Submit(args) => submit(&url, args).await,
        Command::Deps {
            scene,
            json,
            blender,
        } => deps(&url, &scene, &blender, json.json).await,
        Command::Users(cmd) => users(&url, cmd).await,
        // Printed by main before any runtime or connection starts.
        Command::Config(_) => Ok(()),
        Command::Hash { files, stdin } => fileset::hash_command(files, stdin).await,
        Command::Jobs(j) => {
            let mut c = Client::new(&url)?;
            let jobs = c.jobs(j.archived).await?;
            if j.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &jobs
                            .iter()
                            .map(tessera_proto::json::job)
                            .collect::<Vec<_>>()
                    )?
                );
            } else {
                show::jobs(&jobs);
            }
            Ok(())
        }
        Command::Status { job, json } => {
            let mut c = Client::new(&url)?;
            let j = c.job(job).await?;
            if json.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&tessera_proto::json::job(&j))?
                );
            } else {
                show::job(&j);
            }
            Ok(())
        }
        Command::Watch { job } => {
            let mut c = Client::new(&url)?;
            c.job(job).await?;
            client::wait(&mut c, job).await?;
            Ok(())
        }
        Command::Fetch {
            job,
            output,
            preview: true,
        } => crate::preview::fetch(&url, job, output).await,
        Command::Preview { job, output } => crate::preview::make(&url, job, output).await,
        Command::Fetch {
            job,
            output,
            preview: false,
        } => {
            let Some(output) = output else {
                bail!("give the folder for the frames: tessera fetch {job} -o DIR");
            };
            let mut c = Client::new(&url)?;
            let j = c.job(job).await?;
            if j.outputs_total == 0 {
                bail!(
                    "job {job} has no rendered frames yet; wait for it with `tessera watch {job}`"
                );
            }
            let (frames, passes) = client::fetch(&mut c, &j, &output).await?;
            eprintln!("{} frame(s) written to {}", frames.len(), output.display());
            client::say_passes(&passes, &output);
            if client::frame_count(&j) < j.frames_total as usize {
                eprintln!(
                    "job {job} is {}: {} of {} frames so far",
                    tessera_proto::json::job(&j)["state"],
                    client::frame_count(&j),
                    j.frames_total
                );
            }
            Ok(())
        }
        Command::Cancel { job } => {
            let mut c = Client::new(&url)?;
            c.farm
                .cancel_job(pb::JobRef {
                    job_id: job,
                    ..Default::default()
                })
                .await
                .map_err(|s| c.explain(s))?;
            eprintln!("job {job} canceled");
            Ok(())
        }
        Command::Archive { job } => {
            let mut c = Client::new(&url)?;
            c.farm
                .archive_job(pb::JobRef {
                    job_id: job,
                    ..Default::default()
                })
                .await
                .map_err(|s| c.explain(s))?;
            eprintln!("job {job} archived; `tessera jobs --archived` lists it");
            Ok(())
        }
        Command::Delete { job } => {
            let mut c = Client::new(&url)?;
            c.farm
                .delete_job(pb::JobRef {
                    job_id: job,
                    ..Default::default()
                })
                .await
                .map_err(|s| c.explain(s))?;
            eprintln!("job {job} deleted");
            Ok(())
        }
        Command::Pause { job } => {
            let mut c = Client::new(&url)?;
            c.farm
                .pause_job(pb::JobRef {
                    job_id: job,
                    ..Default::default()
                })
                .await
                .map_err(|s| c.explain(s))?;
            eprintln!("job {job} paused; `tessera resume {job}` continues it");
            Ok(())
        }
        Command::Resume { job } => {
            let mut c = Client::new(&url)?;
            c.farm
                .resume_job(pb::JobRef {
                    job_id: job,
                    ..Default::default()
                })
                .await
                .map_err(|s| c.explain(s))?;
            eprintln!("job {job} resumed");
            Ok(())
        }
        Command::Retry {
            job,
            frames: Some(frames),
        } => {
            let mut c = Client::new(&url)?;
            let r = c
                .farm
                .retry_frames(pb::RetryFramesRequest {
                    job_id: job,
                    frames,
                })
                .await
                .map_err(|s| c.explain(s))?
                .into_inner();
            eprintln!(
                "job {job}: {} frame(s) to render again ({})",
                r.frames.len(),
                crate::show::compact_frames(&r.frames)
            );
            Ok(())
        }
        Command::Update {
            job,
            after,
            no_after,
            max_cost,
            no_max_cost,
        } => {
            if after.is_empty() && !no_after && max_cost.is_none() && !no_max_cost {
                bail!("nothing to change; give --after, --no-after, --max-cost or --no-max-cost");
            }
            let mut c = Client::new(&url)?;
            let j = c
                .farm
                .update_job(pb::UpdateJobRequest {
                    job_id: job,
                    set_after: !after.is_empty() || no_after,
                    after,
                    max_cost,
                    clear_max_cost: no_max_cost,
                })
                .await
                .map_err(|s| c.explain(s))?
                .into_inner();
            let deps: Vec<String> = j.after.iter().map(u64::to_string).collect();
            eprintln!(
                "job {job} updated: waits for {}; budget {}",
                if deps.is_empty() {
                    "no job".to_string()
                } else {
                    format!("job(s) {}", deps.join(", "))
                },
                j.max_cost.map_or("none".to_string(), |m| format!("{m:.2}"))
            );
            Ok(())
        }
        Command::Retry { job, frames: None } => {
            let mut c = Client::new(&url)?;
            let j = c
                .farm
                .retry_job(pb::JobRef {
                    job_id: job,
                    ..Default::default()
                })
                .await
                .map_err(|s| c.explain(s))?
                .into_inner();
            let left = j.tasks_total - j.tasks_done;
            eprintln!("job {job} re-queued: {left} task(s) to render again");
            Ok(())
        }
        Command::Blender(BlenderCommand::Install { line, runtimes }) => {
            crate::runtimes::install(&line, runtimes).await
        }
        Command::Blender(BlenderCommand::List { blender }) => crate::runtimes::list(&blender).await,
        Command::Workers(j) => {
            let mut c = Client::new(&url)?;
            let workers = c
                .farm
                .list_workers(pb::ListWorkersRequest {})
                .await
                .map_err(|s| c.explain(s))?
                .into_inner()
                .workers;
            if j.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &workers
                            .iter()
                            .map(tessera_proto::json::worker)
                            .collect::<Vec<_>>()
                    )?
                );
            } else {
                show::workers(&workers);
            }
            Ok(())
        }
        Command::Render(args) => crate::local::render(args).await,
        Command::Doctor(args) => doctor(url, args).await,
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// A checked submission: the frame set, the scene's facts when read, and
/// its files laid out under the job root.
pub struct Prepared {
    /// The scene file.
    pub scene: std::path::PathBuf,
    frames: String,
    facts: Option<client::SceneFacts>,
    layout: fileset::Layout,
    /// Blender features the scene needs.
    features: Vec<String>,
    /// Make a preview video when the job is done (`submit --preview`).
    pub preview: bool,
}

impl Prepared {
    /// The features the scene needs that `have` lacks, by their display names.
    pub fn lacking(&self, have: &[String]) -> Vec<String> {
        self.features
            .iter()
            .filter(|f| !have.contains(f))
            .map(|f| {
                tessera_coordinator::model::hardware::FEATURES
                    .iter()
                    .find(|(k, _)| k == f)
                    .map_or(f.clone(), |(_, name)| name.to_string())
            })
            .collect()
    }
}

/// Checks the scene, frames and tiles; reads the scene with Blender when the
/// frames are not given or the job is tiled (tiles need the frame size).
pub async fn prepare(job: &JobArgs) -> Result<Prepared> {
    let Some(scene) = job.scene.clone() else {
        bail!("give the .blend scene to render (or, for `submit`, --bundle DIR)");
    };
    client::check_scene(&scene)?;
    if job.chunk < 1 {
        bail!(
            "--chunk {} is not a frame count; use 1 or more frames per task",
            job.chunk
        );
    }
    let grid: tessera_coordinator::model::tiles::Grid =
        job.tiles.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    // One Blender start reads the scene's files and facts; an unchanged
    // scene is not read again (see `fileset::trace_cached`). It is read by
    // a Blender of this machine that reads what saved it.
    let local = crate::runtimes::local(&job.reader()).await?;
    let reader = crate::runtimes::choose(&local, &scene, job.requirement()?)?;
    let trace = fileset::trace_cached(&reader.runtime, &scene).await?;
    let facts = trace.facts.as_ref().map(client::SceneFacts::from);
    let frames = match (&job.frames, &facts) {
        (Some(f), _) => f.clone(),
        (None, Some(facts)) => facts.frames.clone(),
        (None, None) => bail!("Blender did not report the scene's frame range; pass --frames"),
    };
    if grid.count() > 1 && facts.is_none() {
        bail!("Blender did not report the scene's resolution, which tiles need; submit without --tiles");
    }
    client::check_frames(&frames)?;
    if let Some(f) = facts.as_ref().filter(|_| grid.count() > 1) {
        tessera_coordinator::model::tiles::split(f.width, f.height, grid, u32::MAX)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let layout = fileset::layout(&scene, &trace, &job.shared)?;
    if !layout.missing.is_empty() && !job.allow_missing {
        bail!(
            "the scene refers to {} file(s) that do not exist:\n  {}\nput them back, fix the paths in Blender, or submit with --allow-missing to render without them",
            layout.missing.len(),
            layout.missing.join("\n  ")
        );
    }
    Ok(Prepared {
        scene,
        frames,
        facts,
        layout,
        features: {
            let mut features = if job.ignore_scene_features {
                Vec::new()
            } else {
                fileset::features(&trace)
            };
            if job.scene_python {
                features.push(tessera_coordinator::model::hardware::SCENE_PYTHON.to_string());
            }
            features
        },
        preview: false,
    })
}

/// Hashes the scene's files and uploads those the coordinator lacks; returns
/// the scene's digest, the file set's digest (None for a self-contained
/// scene), and the bytes and files sent.
async fn upload_files(
    c: &mut Client,
    layout: &fileset::Layout,
) -> Result<(String, Option<String>, u64, usize)> {
    let mut cache = fileset::HashCache::load();
    let entries = fileset::hash_all(layout, &mut cache, false).await?;
    cache.save();
    upload_entries(c, layout, entries).await
}

/// Uploads the hashed files of `layout` (and its file set) that the
/// coordinator lacks; returns what [`upload_files`] does.
pub async fn upload_entries(
    c: &mut Client,
    layout: &fileset::Layout,
    entries: Vec<pb::FileEntry>,
) -> Result<(String, Option<String>, u64, usize)> {
    let scene = entries[0].digest.clone();
    let self_contained =
        entries.len() == 1 && layout.mappings.is_empty() && layout.missing.is_empty();
    let manifest = (!self_contained).then(|| fileset::manifest(layout, entries.clone()));
    let manifest_digest = manifest
        .as_ref()
        .map(|m| blake3::hash(m).to_hex().to_string());
    let mut digests: Vec<String> = entries
        .iter()
        .filter(|e| e.shared.is_empty())
        .map(|e| e.digest.clone())
        .collect();
    digests.extend(manifest_digest.clone());
    let lacking = fileset::missing(c, digests).await?;
    let (sent, count) = fileset::upload(c, layout, &entries, &lacking, false).await?;
    if let (Some(m), Some(d)) = (manifest, &manifest_digest) {
        if lacking.contains(d) {
            c.put_bytes(d, m).await?;
        }
    }
    Ok((scene, manifest_digest, sent, count))
}

/// Says what an upload of `files` files sent.
pub fn say_uploaded(sent: u64, count: usize, files: usize) {
    match (sent, files) {
        (0, 1) => eprintln!("scene already on the coordinator; 0 bytes uploaded"),
        (0, n) => eprintln!(
            "scene and its {} file(s) already on the coordinator; 0 bytes uploaded",
            n - 1
        ),
        (b, 1) => eprintln!("uploaded scene: {b} bytes"),
        (b, n) => {
            eprintln!("uploaded {count} of {n} file(s) (the scene and what it uses): {b} bytes")
        }
    }
}

/// Uploads and submits; returns the job id.
pub async fn submit_job(c: &mut Client, job: &JobArgs, prepared: Prepared) -> Result<u64> {
    let (digest, file_set, sent, count) = upload_files(c, &prepared.layout).await?;
    say_uploaded(sent, count, prepared.layout.files.len());
    let name = prepared
        .scene
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "scene.blend".into());
    let spec = pb::JobSpec {
        scene_digest: digest,
        scene_name: name,
        frames: prepared.frames,
        chunk: u32::try_from(job.chunk).unwrap_or(u32::MAX),
        priority: job.priority,
        max_attempts: job.max_attempts.unwrap_or(0),
        tiles: job.tiles.clone(),
        overscan: Some(job.overscan),
        scene_info: prepared.facts.map(|f| pb::SceneInfo {
            width: f.width,
            height: f.height,
            file_format: f.file_format,
            fps: f.fps,
        }),
        device: job.device.clone(),
        min_vram_gb: job.min_vram,
        tags: job.tag.clone(),
        file_set_digest: file_set.unwrap_or_default(),
        features: prepared.features.clone(),
        blender: job
            .requirement()?
            .map(|r| r.to_string())
            .unwrap_or_default(),
        after: job.after.clone(),
        max_cost: job.max_cost,
        capacity: job.capacity.clone(),
        preview: prepared.preview,
        verify: job.verify,
    };
    let id = c
        .farm
        .submit_job(spec)
        .await
        .map_err(|s| c.explain(s))?
        .into_inner()
        .job_id;
    Ok(id)
}

/// `tessera deps`: the files a scene needs, and which the coordinator has.
async fn deps(
    url: &Access,
    scene: &std::path::Path,
    blender: &std::path::Path,
    json: bool,
) -> Result<()> {
    client::check_scene(scene)?;
    let local = crate::runtimes::local(blender).await?;
    let reader = crate::runtimes::choose(&local, scene, None)?;
    let trace = fileset::trace_cached(&reader.runtime, scene).await?;
    let layout = fileset::layout(scene, &trace, &[])?;
    let mut cache = fileset::HashCache::load();
    let entries = fileset::hash_all(&layout, &mut cache, true).await?;
    cache.save();
    // Whether the coordinator has each file, when it can be asked.
    let lacking = match Client::new(url) {
        Ok(mut c) => fileset::missing(&mut c, entries.iter().map(|e| e.digest.clone()).collect())
            .await
            .map_err(|e| tracing::debug!("cannot ask the coordinator: {e:#}"))
            .ok(),
        Err(_) => None,
    };
    show::deps(&layout, &entries, lacking.as_ref(), json)
}

async fn submit(url: &Access, args: SubmitArgs) -> Result<()> {
    let mut c = Client::new(url)?;
    let id = match &args.bundle {
        Some(dir) => crate::bundle::submit(&mut c, dir, &args.job, args.preview).await?,
        None => {
            let mut frames = prepare(&args.job).await?;
            frames.preview = args.preview;
            submit_job(&mut c, &args.job, frames).await?
        }
    };
    println!("{id}");
    if args.wait || args.output.is_some() {
        let job = client::wait(&mut c, id).await?;
        if let Some(dir) = args.output {
            let (frames, passes) = client::fetch(&mut c, &job, &dir).await?;
            eprintln!("{} frame(s) written to {}", frames.len(), dir.display());
            client::say_passes(&passes, &dir);
        }
        if args.preview {
            eprintln!("the preview video is made now; `tessera fetch {id} --preview` downloads it when `tessera status {id}` says it is ready");
        }
    } else if args.preview {
        eprintln!("a preview video is made when the job is done; `tessera fetch {id} --preview` downloads it");
    }
    Ok(())
}

/// Gives a background task a moment to finish after its shutdown signal.
pub async fn settle<T>(handle: tokio::task::JoinHandle<T>) {
    let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
}

/// `tessera doctor` and `tessera doctor coordinator`.
async fn doctor(mut url: Access, args: DoctorArgs) -> Result<()> {
    use crate::doctor;
    if let Some(DoctorSide::Coordinator(c)) = &args.side {
        return doctor::coordinator(doctor::CoordinatorChecks {
            data: &c.data,
            store: c.store.as_deref(),
            blobs: c.blobs.as_deref(),
            ffmpeg: &c.ffmpeg,
            tls_cert: c.tls_cert.as_deref(),
        })
        .await;
    }
    if let Some(path) = &args.token_file {
        url.token = Some(crate::serve::read_token_file(path)?);
    }
    doctor::worker(doctor::WorkerChecks {
        access: &url,
        cache: &args.cache,
        blender: &args.blender,
        runtimes: args.runtimes.clone(),
    })
    .await
}
