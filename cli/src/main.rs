//! `tessera`: the one binary. Runs a coordinator or a worker, submits and
//! inspects jobs, or renders locally with an embedded farm.

#![recursion_limit = "256"]

mod access;
mod bundle;
mod client;
mod commands;
mod config;
mod doctor;
mod fileset;
mod ha;
mod local;
mod preview;
mod runtimes;
mod serve;
mod setup;
mod show;
mod shutdown;
mod submit;
mod upload;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Tessera: a distributed render farm for Blender Cycles.
#[derive(Parser, Debug)]
#[command(name = "tessera", version, about, propagate_version = true)]
struct Cli {
    /// Coordinator URL for client commands and workers.
    #[arg(
        long,
        global = true,
        env = "TESSERA_COORDINATOR",
        default_value = "http://127.0.0.1:7878"
    )]
    coordinator: String,
    /// Bearer token (default: $TESSERA_TOKEN, then ~/.config/tessera/token).
    #[arg(long, global = true, env = "TESSERA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate (PEM) that signed the coordinator's TLS certificate, for https:// URLs.
    #[arg(long, global = true, env = "TESSERA_CA")]
    ca: Option<PathBuf>,
    /// Log format: human or json.
    #[arg(long, global = true, default_value = "human", value_parser = ["human", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a coordinator.
    Coordinator(CoordinatorArgs),
    /// Run a worker that renders with Blender.
    Worker(WorkerArgs),
    /// Submit a scene for rendering; prints the job id.
    Submit(SubmitArgs),
    /// List jobs.
    Jobs(JobsArgs),
    /// Show one job.
    Status {
        /// The job id.
        job: u64,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Follow a job's progress until it ends.
    Watch {
        /// The job id.
        job: u64,
    },
    /// Download a job's frames (or, with --preview, its preview video).
    Fetch {
        /// The job id.
        job: u64,
        /// Directory for the frames (with --preview: the video's file,
        /// default `job-N-preview.mp4`).
        #[arg(short = 'o', long = "output", required_unless_present = "preview")]
        output: Option<PathBuf>,
        /// Download the job's preview video instead of its frames.
        #[arg(long)]
        preview: bool,
    },
    /// Make a done job's preview video (an H.264 MP4 of its frames, at the
    /// scene's frame rate) on the coordinator, and download it.
    Preview {
        /// The job id.
        job: u64,
        /// The video's file (default `job-N-preview.mp4`).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
    },
    /// Cancel a job: its running renders stop.
    Cancel {
        /// The job id.
        job: u64,
    },
    /// Pause a job: no new tasks start, running renders go back to the queue.
    Pause {
        /// The job id.
        job: u64,
    },
    /// Resume a paused job.
    Resume {
        /// The job id.
        job: u64,
    },
    /// Re-queue the failed and canceled tasks of a failed or canceled job,
    /// or with --frames render those frames of any job again.
    Retry {
        /// The job id.
        job: u64,
        /// Render only these frames again (`10-20`, `3,7`), even of a done job.
        #[arg(long)]
        frames: Option<String>,
    },
    /// Change a job's dependencies (before it starts) or its budget.
    Update {
        /// The job id.
        job: u64,
        /// Wait for this job to be done (repeatable; replaces the job's list).
        #[arg(long, conflicts_with = "no_after")]
        after: Vec<u64>,
        /// Wait for no job any more.
        #[arg(long)]
        no_after: bool,
        /// The most the job may cost; a job paused at its budget resumes with `tessera resume`.
        #[arg(long, conflicts_with = "no_max_cost")]
        max_cost: Option<f64>,
        /// Remove the job's budget.
        #[arg(long)]
        no_max_cost: bool,
    },
    /// Take a finished job out of the coordinator's memory; its summary and
    /// frames stay (`jobs --archived`, `fetch`).
    Archive {
        /// The job id.
        job: u64,
    },
    /// Forget a finished job: its records go and its frames' storage is freed.
    Delete {
        /// The job id.
        job: u64,
    },
    /// List workers.
    Workers(JsonArg),
    /// Blender runtimes on this machine: `install 4.5` puts the official
    /// Blender 4.5 (the `bpy` module from PyPI) in a venv; `list` shows each
    /// Blender found, its version and what it renders.
    #[command(subcommand)]
    Blender(BlenderCommand),
    /// List the files a scene needs: path under the job root, size, found or
    /// missing, and whether the coordinator already has it.
    Deps {
        /// The .blend scene.
        scene: PathBuf,
        #[command(flatten)]
        json: JsonArg,
        /// Blender executable, used to list the scene's files.
        #[arg(long, env = "TESSERA_BLENDER", default_value = "blender")]
        blender: PathBuf,
    },
    /// Print the blake3 digest of files, as the farm addresses them, one JSON
    /// object a line: {"path", "digest", "size"}. The Blender add-on uses it.
    Hash {
        /// Files to hash.
        files: Vec<PathBuf>,
        /// Also read paths from standard input, one a line.
        #[arg(long)]
        stdin: bool,
    },
    /// Render locally: an embedded coordinator and local worker slots in one process.
    Render(RenderArgs),
    /// Manage users and their tokens (admin only).
    #[command(subcommand)]
    Users(UsersCommand),
    /// Config files of the coordinator and the worker.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Check this worker machine (the coordinator, token, TLS and clock,
    /// each Blender, GPUs, disk, open files), or with `doctor coordinator` a
    /// coordinator's; one line per check with its fix; fails if any check does.
    Doctor(DoctorArgs),
}

/// `tessera doctor`: a worker machine's options, as the worker takes them.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct DoctorArgs {
    #[command(subcommand)]
    side: Option<DoctorSide>,
    /// The worker's scene cache directory (its free space is checked).
    #[arg(long, default_value = "tessera-cache")]
    cache: PathBuf,
    /// A Blender the worker renders with (repeatable), as `worker --blender`.
    #[arg(long, env = "TESSERA_BLENDER", default_value = "blender")]
    blender: Vec<String>,
    /// Where `--blender 4.5` finds `bpy` runtimes (default: $TESSERA_RUNTIMES, else CACHE/runtimes).
    #[arg(long)]
    runtimes: Option<PathBuf>,
    /// Read the worker token from this file (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

/// `tessera doctor coordinator`.
#[derive(Subcommand, Debug)]
enum DoctorSide {
    /// Check a coordinator machine: the data directory, the store (and with
    /// PostgreSQL an active coordinator), the blobs, ffmpeg, TLS expiry.
    Coordinator(DoctorCoordinatorArgs),
}

/// The coordinator's options that `doctor coordinator` checks, as the coordinator takes them.
#[derive(Args, Debug)]
struct DoctorCoordinatorArgs {
    /// Data directory (metadata and blobs).
    #[arg(long, default_value = "tessera-data")]
    data: PathBuf,
    /// `sled` (the default) or `postgres://USER@HOST:PORT/DATABASE`.
    #[arg(long, env = "TESSERA_STORE", hide_env_values = true)]
    store: Option<String>,
    /// A directory or s3://bucket/prefix (default: DATA/blobs).
    #[arg(long, env = "TESSERA_BLOBS")]
    blobs: Option<String>,
    /// The ffmpeg that makes preview videos.
    #[arg(long, env = "TESSERA_FFMPEG", default_value = "ffmpeg")]
    ffmpeg: PathBuf,
    /// TLS certificate chain (PEM) of the gRPC port; its expiry is checked.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
}

/// `tessera config ...`.
#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the options a coordinator or worker would run with, merged from
    /// flags, environment, `--config FILE` and defaults, each with its
    /// source; secrets redacted. E.g. `tessera config print worker --config /etc/tessera/worker.toml`.
    Print {
        /// coordinator or worker.
        role: String,
        /// The arguments that role would be started with.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Subcommand, Debug)]
enum UsersCommand {
    /// Add a user and print its token (shown once).
    Add {
        /// A short name: letters, digits, `-`, `_`, `.`.
        name: String,
        /// user (submits and sees its own jobs), worker (joins the farm),
        /// metrics (reads /metrics, every job's series, nothing else) or admin.
        #[arg(long, default_value = "user", value_parser = ["user", "worker", "metrics", "admin"])]
        role: String,
    },
    /// List users.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a user: its token stops working at once.
    Remove {
        /// The user's name.
        name: String,
    },
}

#[derive(Args, Debug)]
struct JsonArg {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct JobsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Include archived jobs.
    #[arg(long)]
    archived: bool,
}

#[derive(Args, Debug)]
struct CoordinatorArgs {
    /// A TOML file of options, keyed by these flags' names (`lease-ttl = 30`);
    /// a flag or its environment variable overrides the file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: String,
    /// Data directory (metadata and blobs).
    #[arg(long, default_value = "tessera-data")]
    data: PathBuf,
    /// Where blobs (scenes, frames) are kept: a directory (default: DATA/blobs)
    /// or s3://bucket/prefix (an active and a standby coordinator share one), with the endpoint and credentials from the AWS
    /// environment variables (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP) or ~/.aws/config and credentials.
    #[arg(long, env = "TESSERA_BLOBS")]
    blobs: Option<String>,
    /// Lease lifetime without renewal, in seconds.
    #[arg(long, default_value_t = 30.0)]
    lease_ttl: f64,
    /// Seconds an unreferenced blob (a stitched frame's tile) is kept after
    /// anyone last uploaded or asked about it (default: twice --lease-ttl).
    #[arg(long)]
    blob_grace: Option<f64>,
    /// Most frames (tasks) in one job.
    #[arg(long, default_value_t = 1_000_000)]
    max_frames: u64,
    /// Archive finished jobs this many days after they end (they leave the
    /// scheduler's memory; `tessera jobs --archived` lists them). Off when
    /// not given.
    #[arg(long)]
    keep_days: Option<f64>,
    /// Failures a task may have before its job fails (default for jobs).
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// Largest upload accepted, in MiB.
    #[arg(long, default_value_t = 8192)]
    max_upload_mib: u64,
    /// MiB kept free on the volumes of --data and --blobs: a write that would
    /// leave less is refused, saying so, so a filling disk never breaks the
    /// metadata store.
    #[arg(long, default_value_t = 64)]
    min_free_mib: u64,
    /// Most tiles in one frame.
    #[arg(long, default_value_t = 256)]
    max_tiles: u32,
    /// HTTP listen address for /metrics (Prometheus), the JSON API (/api/v1/)
    /// and the web dashboard (/); HTTPS with --tls-cert. Off when not given.
    #[arg(long)]
    http: Option<String>,
    /// A GPU at or above this temperature (°C) drains its worker.
    #[arg(long, default_value_t = 90)]
    max_gpu_temp: u32,
    /// More ECC errors than this within a day drain a GPU's worker.
    #[arg(long, default_value_t = 10)]
    max_ecc_per_day: u64,
    /// Failed attempts after which a worker is blocked for a job.
    #[arg(long, default_value_t = 3)]
    block_after: u32,
    /// Largest gRPC message accepted, in MiB.
    #[arg(long, default_value_t = 4)]
    max_message_mib: u64,
    /// Largest frame (and tile) accepted, WIDTHxHEIGHT: at most W*H pixels,
    /// neither side over the larger of W and H. Checked at submit and before stitching.
    #[arg(long, default_value = "16384x16384")]
    max_pixels: tessera_coordinator::imaging::limits::PixelLimit,
    /// Most workers one worker token may have online at once.
    #[arg(long, default_value_t = 1024)]
    max_workers_per_token: u32,
    /// Most render slots (and GPUs) one worker may offer.
    #[arg(long, default_value_t = 256)]
    max_slots: u32,
    /// TLS certificate chain (PEM) for the gRPC port.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for the gRPC port.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Allow plain text on a non-loopback address (tokens travel unencrypted).
    #[arg(long)]
    allow_plaintext: bool,
    /// Seconds an HTTP request's head (or a gRPC connection's HTTP/2
    /// preface) may take to arrive; slower connections are closed.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a connection may move no byte either way before it is closed
    /// (live gRPC clients answer pings sent every third of this).
    #[arg(long, default_value_t = 120.0)]
    idle_timeout: f64,
    /// Each this many seconds a request body waits for the client must
    /// bring 1 KiB (or its end); slower uploads are cut off.
    #[arg(long, default_value_t = 30.0)]
    body_timeout: f64,
    /// Most connections from one IP address, gRPC and HTTP together (raise
    /// it when many workers share one NAT address).
    #[arg(long, default_value_t = 256)]
    max_connections_per_address: usize,
    /// Most connections in all, gRPC and HTTP together (default: three
    /// quarters of the open-file limit, `ulimit -n`, at most 16384).
    #[arg(long)]
    max_connections: Option<usize>,
    /// The autoscaling signal `tessera_desired_slots` asks for enough slots to
    /// finish the queued work within this many minutes.
    #[arg(long, default_value_t = 30.0)]
    target_drain_minutes: f64,
    /// The ffmpeg that makes preview videos (`submit --preview`, `tessera preview`).
    #[arg(long, env = "TESSERA_FFMPEG", default_value = "ffmpeg")]
    ffmpeg: PathBuf,
    /// The longest one preview video may take to make, in seconds.
    #[arg(long, default_value_t = 600.0)]
    preview_timeout: f64,
    /// The fraction of tasks done by untrusted workers (`worker --untrusted`)
    /// rendered again on a different worker and compared (0..1).
    #[arg(long, default_value_t = tessera_coordinator::DEFAULT_VERIFY_UNTRUSTED, value_parser = fraction)]
    verify_untrusted: f64,
    /// Where the metadata lives: `sled` (DATA/db, the default) or
    /// `postgres://USER@HOST:PORT/DATABASE` (PostgreSQL 15+; several
    /// coordinators on one database are one active and standbys).
    #[arg(long, env = "TESSERA_STORE", hide_env_values = true)]
    store: Option<String>,
    /// With a PostgreSQL store: a standby takes over within this many
    /// seconds of the active coordinator's death.
    #[arg(long, default_value_t = 10.0)]
    failover_seconds: f64,
    /// With a PostgreSQL store: the URL clients reach this coordinator at,
    /// which standbys name (default: http(s)://HOST:PORT of --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// Ask the coordinators at --coordinator (a,b) whether each is active or
    /// standby, print it, and exit.
    #[arg(long)]
    status: bool,
}

/// `tessera blender ...`.
#[derive(Subcommand, Debug)]
enum BlenderCommand {
    /// Install the newest release of a Blender line (`4.5`) or one release
    /// (`4.5.15`) as the `bpy` module, in a venv under the runtimes folder.
    Install {
        /// The line or release.
        #[arg(value_name = "VERSION")]
        line: String,
        /// The runtimes folder (default: $TESSERA_RUNTIMES, else ~/.cache/tessera/runtimes).
        #[arg(long)]
        runtimes: Option<PathBuf>,
    },
    /// List the Blenders on this machine: the `blender` given and every
    /// installed `bpy` runtime, with their versions and what they render.
    List {
        /// A Blender executable to list first.
        #[arg(long, env = "TESSERA_BLENDER", default_value = "blender")]
        blender: PathBuf,
    },
}

#[derive(Args, Debug)]
struct WorkerArgs {
    /// A TOML file of options, keyed by these flags' names (`slots = 2`,
    /// `tag = ["a", "b"]`); a flag or its environment variable overrides the file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Name shown in `tessera workers` (default: host name).
    #[arg(long)]
    name: Option<String>,
    /// Scene cache directory.
    #[arg(long, default_value = "tessera-cache")]
    cache: PathBuf,
    /// Most GiB of job files (textures, libraries, caches) kept in the cache;
    /// the least recently used go first, never those of a task in progress.
    #[arg(long, default_value_t = 50.0)]
    cache_max_gib: f64,
    /// Most GiB one job's root may take in copies, where a file cannot be
    /// hard-linked from the cache (default: --cache-max-gib).
    #[arg(long)]
    max_root_gib: Option<f64>,
    /// Most GiB of memory one Blender may allocate, so a scene that
    /// decompresses without bound fails alone (default: 3/4 of this
    /// machine's memory; 0: no limit).
    #[arg(long)]
    blender_max_memory_gib: Option<f64>,
    /// Where this worker sees the studio's shared storage, for jobs submitted
    /// with `--shared`: `--path-map /mnt/projects=/net/projects` (artist's
    /// path = this machine's; repeatable).
    #[arg(long)]
    path_map: Vec<String>,
    /// Concurrent render slots.
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// Render device: auto (one slot per NVIDIA GPU, OptiX where supported, else CPU slots), cpu, cuda or optix.
    #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda", "optix"])]
    device: String,
    /// A tag jobs can require (repeatable).
    #[arg(long)]
    tag: Vec<String>,
    /// TEST ONLY: declare a GPU that is not there, as "NAME:GB" (repeatable). Its slot is matched as
    /// that GPU but renders on the CPU unless --device cuda|optix is forced.
    #[cfg(feature = "test-hooks")]
    #[arg(long = "fake-gpu", value_name = "NAME:GB")]
    fake_gpu: Vec<String>,
    /// TEST ONLY: a JSON file of declared GPUs' telemetry, re-read at every report.
    #[cfg(feature = "test-hooks")]
    #[arg(long = "fake-telemetry", value_name = "FILE")]
    fake_telemetry: Option<PathBuf>,
    /// Seconds between GPU telemetry reports.
    #[arg(long, default_value_t = 5.0)]
    telemetry_interval: f64,
    /// On SIGTERM (e.g. a spot preemption notice), let renders in flight run this many
    /// seconds before releasing them to other workers.
    #[arg(long, default_value_t = 0.0)]
    grace: f64,
    /// A Blender to render with (repeatable): a path (a `blender` binary, or
    /// a venv with the `bpy` module), or a line such as `4.5`: the official
    /// Blender as the `bpy` module from PyPI, installed once under --runtimes
    /// (with the Python its wheels need). The coordinator picks, for each
    /// task, a runtime that reads the job's scene.
    #[arg(long, env = "TESSERA_BLENDER", default_value = "blender")]
    blender: Vec<String>,
    /// Where `--blender 4.5` installs and finds `bpy` runtimes (default:
    /// $TESSERA_RUNTIMES, else CACHE/runtimes).
    #[arg(long)]
    runtimes: Option<PathBuf>,
    /// Render threads per slot (default: cores divided among slots).
    #[arg(long)]
    threads: Option<u32>,
    /// Start a fresh Blender for every task instead of keeping a warm session per job.
    #[arg(long)]
    fresh_process: bool,
    /// Close a warm Blender session after this many seconds without work.
    #[arg(long, default_value_t = 60.0)]
    session_idle: f64,
    /// Read the worker token from this file (`-`: standard input) instead of --token or
    /// $TESSERA_TOKEN, so it is on no command line and in no environment Blender could read.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// TEST ONLY: the first Blender session of each slot fails its renders as a crashing GPU
    /// driver would, so tests can check that a failed session is never used again.
    #[cfg(feature = "test-hooks")]
    #[arg(long, hide = true)]
    fail_first_render: bool,
    /// What this whole machine costs per hour (any currency); each slot is
    /// charged an equal share for the time it renders.
    #[arg(long, default_value_t = 0.0)]
    price_per_hour: f64,
    /// How this machine is bought. Spot workers release their renders at once on SIGTERM
    /// and serve only jobs that accept spot capacity.
    #[arg(long, default_value = "on-demand", value_parser = ["on-demand", "spot", "reserved"])]
    capacity: String,
    /// This machine is not the operator's own (a rented or volunteer pool):
    /// the coordinator verifies a share of its tasks (`--verify-untrusted`).
    #[arg(long)]
    untrusted: bool,
    /// Run the Python stored in a scene (drivers, registered scripts) for
    /// jobs submitted with --scene-python: Blender starts with
    /// --enable-autoexec for them. A RISK: that Python can do anything this
    /// worker's user can (read its cache and token file, reach the network).
    /// Allow it only on machines set apart for trusted scenes.
    #[arg(long)]
    allow_scene_python: bool,
    /// Keep no spare Blender on idle slots. By default each idle slot has
    /// one started (about 80 MB of memory of its own, no GPU memory), so a
    /// job's first task there does not wait the half second Blender takes
    /// to start.
    #[arg(long)]
    no_spare_blender: bool,
    /// TEST ONLY: change one pixel of every PNG this worker renders, after
    /// Blender wrote it, so tests can check that verification catches it.
    #[cfg(feature = "test-hooks")]
    #[arg(long, hide = true)]
    test_corrupt_pixel: bool,
}

impl JobArgs {
    /// The job's Blender version requirement, when `--blender` gives one.
    fn requirement(
        &self,
    ) -> anyhow::Result<Option<tessera_coordinator::model::runtime::VersionReq>> {
        runtimes::requirement(Some(&self.blender))
    }

    /// The Blender that reads the scene here: `--blender` when it is a path,
    /// else `blender` on PATH (installed `bpy` runtimes are tried too).
    fn reader(&self) -> PathBuf {
        match self.requirement() {
            Ok(Some(_)) | Err(_) => PathBuf::from("blender"),
            Ok(None) => PathBuf::from(&self.blender),
        }
    }
}

/// What a job asks for; shared by `submit` and `render`.
#[derive(Args, Debug, Clone)]
struct JobArgs {
    /// The .blend scene.
    scene: Option<PathBuf>,
    /// Frames: `7`, `1-250`, `1-100x2`, `1,5,10-20` (default: the scene's frame range).
    #[arg(long)]
    frames: Option<String>,
    /// Frames per task (default: sized by the farm, so that a task of tiny frames carries about 2 s of work).
    #[arg(long, allow_negative_numbers = true)]
    chunk: Option<i64>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Failures a task may have before the job fails (default: the coordinator's).
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Split every frame into columns x rows tiles, stitched back pixel-exactly (PNG or OpenEXR output).
    #[arg(long, default_value = "1x1")]
    tiles: String,
    /// Overscan margin of tiles in pixels, so that adaptive sampling, denoising and compositing see
    /// their neighbours [default: 0 when the scene renders each pixel on its own (Cycles without
    /// those, nor path guiding), else 16].
    #[arg(long)]
    overscan: Option<u32>,
    /// Required render device: any, cpu, cuda or optix.
    #[arg(long, default_value = "any")]
    device: String,
    /// Least GPU memory a slot must have, in GB (GiB).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    min_vram: f64,
    /// A tag the rendering workers must carry (repeatable).
    #[arg(long)]
    tag: Vec<String>,
    /// The Blender versions that may render the job: `4.5` (that line),
    /// `>=4.2`, `^4.2` (it or newer within 4.x). Default: the version that
    /// saved the scene, or newer within its major. A path instead names the
    /// Blender that reads the scene's frame range, size and files here.
    #[arg(long, env = "TESSERA_BLENDER", default_value = "blender")]
    blender: String,
    /// Submit even when files the scene refers to are missing; the job
    /// records them, and `status` shows them.
    #[arg(long)]
    allow_missing: bool,
    /// Submit without the Blender features read from the scene (denoiser,
    /// Eevee): instead of waiting for a worker that has them, the job goes to
    /// any worker, and one that lacks them fails the job with Blender's words.
    #[arg(long)]
    ignore_scene_features: bool,
    /// A folder on the studio's shared storage (repeatable): files under it
    /// are not uploaded; each worker reaches them through its `--path-map`.
    #[arg(long)]
    shared: Vec<PathBuf>,
    /// Start only after this job is done (repeatable); canceled if it fails or is canceled.
    #[arg(long)]
    after: Vec<u64>,
    /// The most this job may cost (workers' --price-per-hour); it pauses when reached.
    #[arg(long)]
    max_cost: Option<f64>,
    /// Which workers may render it: spot-ok (any) or on-demand-only (never preempted).
    #[arg(long, default_value = "spot-ok", value_parser = ["spot-ok", "on-demand-only"])]
    capacity: String,
    /// Render this fraction of tasks (0..1) a second time on a different
    /// worker and compare digests; frames are delivered once two agree, a
    /// mismatch is settled by a third worker (at least one task when above 0).
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    verify: f64,
    /// Run the Python stored in the scene (drivers that need auto-run,
    /// registered scripts), as `blender -b -y` would: only workers started
    /// with --allow-scene-python take the job. Without it such drivers are
    /// not evaluated, as in `blender -b` without `-y`, and the job says so.
    #[arg(long)]
    scene_python: bool,
}

/// A fraction from 0 to 1, for `--verify` and `--verify-untrusted`.
fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a fraction of tasks; use a number from 0 to 1, e.g. 0.05"
        )),
    }
}

#[derive(Args, Debug)]
struct SubmitArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Wait for the job to end, with a progress bar.
    #[arg(long)]
    wait: bool,
    /// Download the frames here when the job is done (implies --wait).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Make a preview video (an H.264 MP4 of the frames, at the scene's
    /// frame rate) when the job is done; `fetch --preview` downloads it.
    #[arg(long)]
    preview: bool,
    /// Submit a job bundle exported by the Blender add-on ("Export job
    /// bundle") instead of a scene: its files and settings travel as they
    /// are; --frames, --priority, --tag and --allow-missing still apply.
    #[arg(long, value_name = "DIR", conflicts_with = "scene")]
    bundle: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct RenderArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Local worker slots.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Directory for the frames.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Keep the farm's data here instead of a temporary directory.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Render threads per slot (default: cores divided among slots).
    #[arg(long)]
    threads: Option<u32>,
    /// Start a fresh Blender for every task instead of keeping a warm session per job.
    #[arg(long)]
    fresh_process: bool,
}

fn init_logging(format: &str, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = match config::parse(std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Command::Config(ConfigCommand::Print { role, args }) = &cli.command {
        return match config::print(role, args) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let server = matches!(cli.command, Command::Coordinator(_) | Command::Worker(_));
    init_logging(&cli.log_format, if server { "info" } else { "warn" });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker's test-only flags exist only with the `test-hooks` feature.
    #[test]
    fn test_hooks_are_flags_only_with_their_feature() {
        for hook in [
            &["--fail-first-render"][..],
            &["--test-corrupt-pixel"],
            &["--fake-gpu", "RTX 4090:24"],
            &["--fake-telemetry", "t.json"],
        ] {
            let args = ["tessera", "worker"].iter().chain(hook);
            let parsed = Cli::try_parse_from(args);
            assert_eq!(
                parsed.is_ok(),
                cfg!(feature = "test-hooks"),
                "{hook:?}: {:?}",
                parsed.err().map(|e| e.to_string())
            );
        }
        let help = <Cli as clap::CommandFactory>::command()
            .find_subcommand_mut("worker")
            .expect("a worker command")
            .render_long_help()
            .to_string();
        assert_eq!(
            help.contains("--fake-gpu"),
            cfg!(feature = "test-hooks"),
            "{help}"
        );
        assert!(!help.contains("--fail-first-render"), "hidden: {help}");
    }
}
