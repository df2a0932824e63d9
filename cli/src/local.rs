//! `tessera render`: an embedded coordinator and local worker slots in one
//! process, for a first render without any set-up.
//!
//! The embedded coordinator listens on loopback with authentication on, like
//! any other: this process issues itself a fresh random token at start and
//! hands it to its own worker slots and client, so another local user or
//! process that finds the port cannot submit, read frames or join as a worker.

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::client::{self, Client};
use crate::shutdown::{settle, shutdown_signal};
use crate::submit::{prepare, submit_job};
use crate::RenderArgs;
use tessera_worker::connect::Access;

/// The user the embedded farm's own token belongs to.
const LOCAL_USER: &str = "tessera-render";

/// Renders a scene on this machine through a private farm.
pub async fn render(args: RenderArgs) -> Result<()> {
    if args.job.verify > 0.0 {
        anyhow::bail!(
            "--verify renders tasks again on a different worker, and `tessera render` has one (its slots are one worker); submit the job to a farm with two or more workers instead"
        );
    }
    // The local worker offers every Blender of this machine; the farm picks
    // the one that reads the scene (or the one `--blender 4.5` names).
    // Logged at both ends, so a log says where a run's first moments went
    // (`scripts/phases.py`): a scene or Blender not seen before is read by
    // a Blender start here, before the farm starts.
    let reading = std::time::Instant::now();
    tracing::info!("reading the scene and this machine's Blender runtimes");
    let local = crate::runtimes::local(&args.job.reader()).await?;
    // This machine's Blenders first (what each can do is remembered after
    // the first run): the local worker's spare Blenders then start at once,
    // and boot while the scene is read (a Blender start of its own for a
    // scene not read before) and while the farm starts.
    let mut offered = crate::runtimes::offer_local(&local).await?;
    // The one that reads the scene, known from the file's header without a
    // Blender start. Where none does (or no scene is given), `prepare`
    // below says so.
    let chosen = args
        .job
        .scene
        .as_deref()
        .map(|scene| crate::runtimes::choose(&local, scene, args.job.requirement()?));
    // The spares start with the first runtime offered: the chosen one goes
    // first, so a scene another Blender saved (4.5 beside Debian's 3.4)
    // does not boot one Blender for nothing and then its own.
    if let Some(Ok(fits)) = &chosen {
        if let Some(at) = offered.iter().position(|o| o.runtime == fits.runtime) {
            offered[..=at].rotate_right(1);
        }
    }
    // The user's own machine: --scene-python runs the scene's Python here,
    // as `blender -b -y` would.
    if args.job.scene_python {
        for o in &mut offered {
            o.caps
                .features
                .push(tessera_coordinator::model::hardware::SCENE_PYTHON.to_string());
        }
    }
    let scratch = tempfile::Builder::new()
        .prefix("tessera-render-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let mut worker_config = worker_config(&args, &scratch, offered.clone())?;
    let mode = crate::worker::render_mode(args.fresh_process, 60.0)?;
    // Dropped (its Blenders ended) if anything below fails first.
    let renderer = tessera_worker::agent::start_blender(&worker_config, mode)?;
    let frames = prepare(&args.job).await?;
    tracing::info!(
        ms = reading.elapsed().as_millis() as u64,
        "scene and Blender runtimes read"
    );
    let chosen = chosen.context("give the .blend scene to render")??;
    let features = offered
        .iter()
        .find(|o| o.runtime == chosen.runtime)
        .map(|o| o.caps.features.clone())
        .unwrap_or_default();
    let lacking = frames.lacking(&features);
    if !lacking.is_empty() {
        anyhow::bail!(
            "this machine's Blender {} lacks {}, which the scene uses{}, or submit it to a farm whose workers' Blender has it",
            chosen.version,
            lacking.join(" and "),
            if lacking.iter().any(|f| f == "OpenImageDenoise") {
                " (denoising is on): turn off denoising (Render Properties > Sampling > Denoise)"
            } else {
                ": change the scene"
            }
        );
    }
    let data = args
        .data
        .clone()
        .unwrap_or_else(|| scratch.path().join("data"));
    // A private farm on loopback for this process alone, with a token of
    // its own (new at every run): nothing for the user to set up.
    let config = tessera_coordinator::Config {
        auth: true,
        ..tessera_coordinator::Config::default()
    };
    let coord = tessera_coordinator::Coordinator::open(&data, config)
        .with_context(|| format!("cannot open the data directory {}", data.display()))?;
    let token = coord
        .farm()
        .issue_token(LOCAL_USER, tessera_coordinator::auth::Role::Admin)
        .with_context(|| format!("cannot issue a token in {}", data.display()))?;
    let access = Access {
        url: String::new(),
        token: Some(token),
        ca: None,
    };
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot open a local port")?;
    let url = format!("http://{}", listener.local_addr()?);
    let access = Access { url, ..access };
    let (stop_tx, stop_rx) = watch::channel(false);
    let server = {
        let mut rx = stop_rx.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            coord.serve(listener, None, stopped).await
        })
    };
    worker_config.access = access.clone();
    let worker = tokio::spawn(tessera_worker::agent::run(
        worker_config,
        renderer,
        stop_rx.clone(),
    ));
    let result = async {
        let mut c = Client::new(&access)?;
        let id = submit_job(&mut c, &args.job, frames).await?;
        let job = tokio::select! {
            j = client::wait(&mut c, id) => j?,
            _ = shutdown_signal() => anyhow::bail!("interrupted"),
        };
        // Straight from the embedded coordinator's blob directory: no
        // round trip through its gRPC port and no second copy of each frame.
        let source = client::Source::Local {
            blobs: &data.join("blobs"),
            link: args.data.is_none(),
        };
        let fetched = client::fetch_from(&mut c, &job, &args.output, source).await?;
        Ok::<_, anyhow::Error>(fetched)
    }
    .await;
    let _ = stop_tx.send(true);
    settle(worker).await;
    settle(server).await;
    let (paths, passes) = result?;
    eprintln!(
        "{} frame(s) written to {}",
        paths.len(),
        args.output.display()
    );
    client::say_passes(&passes, &args.output);
    for p in paths.iter().chain(&passes) {
        println!("{}", p.display());
    }
    Ok(())
}

/// The local worker's configuration: `args.workers` CPU slots sharing the
/// cores, every Blender of `offered`, its cache in `scratch`.
fn worker_config(
    args: &RenderArgs,
    scratch: &tempfile::TempDir,
    offered: Vec<tessera_worker::runtime::Offered>,
) -> Result<tessera_worker::agent::WorkerConfig> {
    let slots = args.workers.max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    Ok(tessera_worker::agent::WorkerConfig {
        // Set once the embedded coordinator listens.
        access: Access {
            url: String::new(),
            token: None,
            ca: None,
        },
        name: "local".into(),
        cache: scratch.path().join("cache"),
        slots: tessera_worker::slots::plan(
            &[],
            &[],
            tessera_worker::slots::DeviceChoice::Force(tessera_worker::blender::Device::Cpu),
            slots,
        )
        .map_err(anyhow::Error::msg)?,
        runtimes: offered,
        threads: args.threads.or(Some((cores / slots).max(1))),
        hardware: Default::default(),
        tags: Vec::new(),
        cache_max_bytes: 50 << 30,
        max_root_bytes: 50 << 30,
        path_map: Vec::new(),
        grace: std::time::Duration::ZERO,
        #[cfg(feature = "test-hooks")]
        fail_first_render: false,
        price_per_hour: 0.0,
        capacity: "on-demand".into(),
        untrusted: false,
        #[cfg(feature = "test-hooks")]
        test_corrupt_pixel: false,
        allow_scene_python: args.job.scene_python,
        spare_blender: true,
        // Its one job's tasks all ask as --scene-python says.
        spare_scene_python: args.job.scene_python,
    })
}
