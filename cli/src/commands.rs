//! The top of the CLI: runs the parsed command line, one arm per
//! subcommand, with the small commands (jobs, status, cancel, users, ...)
//! written here and the larger ones in their own modules. Nothing below
//! names this module.

use anyhow::{bail, Result};
use tessera_proto as pb;
use tessera_worker::connect::Access;

use crate::access::{access, token_on_command_line};
use crate::client::{self, Client};
use crate::{fileset, show, submit, upload};
use crate::{BlenderCommand, Cli, Command, DoctorArgs, DoctorSide, SubmitArgs, UsersCommand};

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
        Command::Coordinator(args) => crate::serve::coordinator(args).await,
        Command::Worker(args) => crate::worker::run(&url, args).await,
        Command::Submit(args) => submit(&url, args).await,
        Command::Deps {
            scene,
            json,
            blender,
        } => deps(&url, &scene, &blender, json.json).await,
        Command::Users(cmd) => users(&url, cmd).await,
        // Printed by main before any runtime or connection starts.
        Command::Config(_) => Ok(()),
        Command::Hash { files, stdin } => upload::hash_command(files, stdin).await,
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
            let frames = j.frames_total.saturating_sub(j.frames_done);
            eprintln!("job {job} re-queued: {frames} frame(s) in {left} task(s) to render again");
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

/// `tessera deps`: the files a scene needs, and which the coordinator has.
async fn deps(
    url: &Access,
    scene: &std::path::Path,
    blender: &std::path::Path,
    json: bool,
) -> Result<()> {
    submit::check_scene(scene)?;
    let local = crate::runtimes::local(blender).await?;
    let reader = crate::runtimes::choose(&local, scene, None)?;
    let trace = fileset::trace_cached(&reader.runtime, scene).await?;
    let layout = fileset::layout(scene, &trace, &[])?;
    let mut cache = upload::HashCache::load();
    let entries = upload::hash_all(&layout, &mut cache, true).await?;
    cache.save();
    // Whether the coordinator has each file, when it can be asked.
    let lacking = match Client::new(url) {
        Ok(mut c) => upload::missing(&mut c, entries.iter().map(|e| e.digest.clone()).collect())
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
            let mut frames = submit::prepare(&args.job).await?;
            frames.preview = args.preview;
            submit::submit_job(&mut c, &args.job, frames).await?
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
        url.token = Some(crate::access::read_token_file(path)?);
    }
    doctor::worker(doctor::WorkerChecks {
        access: &url,
        cache: &args.cache,
        blender: &args.blender,
        runtimes: args.runtimes.clone(),
    })
    .await
}
