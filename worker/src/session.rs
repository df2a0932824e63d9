//! Blender sessions: one long-lived Blender per (job, slot) that renders
//! frame after frame with Cycles' persistent data, instead of paying process
//! start, scene load and BVH build for every task (or, with `reuse` off, one
//! Blender per task, run the same way).
//!
//! The worker starts `blender -b --factory-startup --disable-autoexec SCENE
//! --python-exit-code 3 --python session.py -- --reply-fd 3` (or the same
//! through `blender/bpy_run.py` for a `bpy` runtime, see [`crate::runtime`])
//! with a scrubbed environment ([`crate::isolation`]), in the runtime the
//! coordinator chose for the task, writes one JSON render command per line
//! on Blender's stdin, and reads the answers on a pipe of their own (fd 3 in
//! Blender), never from Blender's stdout. Both are typed in [`messages`]. Stdout and stderr are still read:
//! they fill the log tail sent with a failure, and error lines printed during
//! a render (a Python driver failing, a file that cannot be saved) fail that
//! render even though Blender carries on.
//!
//! Every frame is checked before it counts ([`crate::verify`]). A session
//! whose render failed in any way is ended, never asked again: after some
//! failures Blender's next render in the same process "succeeds" at once with
//! a black frame. A session is kept while its slot receives tasks of the same
//! job; it is closed when the slot moves to another job, when it has been idle
//! for the configured time, when its job ends, and when Blender dies.
//!
//! A slot with no session keeps a spare Blender (`SlotSpare`), started the
//! same way without a scene (`--spare`): the next task that asks for the same
//! runtime, device and scene-Python policy sends it an `open` command instead
//! of waiting for a Blender to start. A slot rendering a task whose next
//! task (leased ahead) is another job's starts that task's spare while it
//! renders ([`Renderer::expect`]), so the job's first task there waits for
//! no Blender start either.

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, watch};

use crate::blender::{
    child_setup, failure, is_error_line, read_lines, summarize, PassFile, Progress, RenderFailure,
    RenderRequest, RenderedFrame, Renderer,
};
use crate::error::Error;
use crate::failure::is_python_exception;
use crate::failure::Kind;
use crate::scene_python::SkippedDrivers;
use crate::verify;

use crate::session_protocol::{self as messages, Command, Reply};

/// The session script, shipped inside the binary so a worker needs no checkout.
const SCRIPT: &str = include_str!("../../blender/session.py");
/// Rewrites absolute references into a job root (imported by the session).
const REMAP: &str = include_str!("../../blender/remap.py");
/// The reference walk `remap.py` shares with submit-time tracing.
const DEPS: &str = include_str!("../../blender/deps.py");
/// Reads Cycles' progress lines (imported by the session).
const CYCLES_PROGRESS: &str = include_str!("../../blender/cycles_progress.py");

/// Lines of Blender's output kept for a failure report.
const LOG_TAIL_LINES: usize = 80;

/// How long Blender may take to load a scene before the session is given up.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// How a [`SessionRenderer`] runs Blender.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The Blenders this worker offers; a task names the version to use.
    pub runtimes: Vec<crate::runtime::Offered>,
    /// Where the session script and Blender's temporary folders go.
    pub dir: PathBuf,
    /// Idle time after which a kept session closes.
    pub idle: Duration,
    /// Keep a session between tasks of a job (false: one Blender per task).
    pub reuse: bool,
    /// Keep a spare Blender started on each idle slot, waiting for its
    /// scene (see `SlotSpare`).
    pub spare: bool,
    /// Start the spares with the scene's stored Python allowed
    /// ([`crate::agent::WorkerConfig::spare_scene_python`]).
    pub spare_scene_python: bool,
    /// TESTS ONLY: the first session of each slot fails its renders as a
    /// crashing GPU driver would (`--fail-first-render`).
    #[cfg(feature = "test-hooks")]
    pub fail_first_render: bool,
}

/// What a Blender is started with before it knows its scene: a spare
/// Blender started with one serves a task that asks for the same.
#[derive(Debug, Clone, PartialEq)]
struct Launch {
    runtime: crate::runtime::Runtime,
    device: crate::blender::Device,
    /// The GPU it is pinned to (`CUDA_VISIBLE_DEVICES`).
    gpu_uuid: Option<String>,
    /// Started with the scene's stored Python allowed (`--enable-autoexec`).
    scene_python: bool,
}

impl Launch {
    fn of(req: &RenderRequest, runtime: crate::runtime::Runtime) -> Self {
        Self {
            runtime,
            device: req.device,
            gpu_uuid: req.gpu_uuid.clone(),
            scene_python: req.scene_python,
        }
    }
}

/// The scene a Blender loads, and the job root its references are
/// rewritten into (the root and the mappings file).
struct Opening {
    scene: PathBuf,
    root: Option<(PathBuf, PathBuf)>,
}

/// One running Blender serving one job on one slot (or, as a slot's spare,
/// waiting for its scene).
struct Session {
    job: u64,
    launch: Launch,
    scene: PathBuf,
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    replies: mpsc::UnboundedReceiver<Reply>,
    lines: mpsc::UnboundedReceiver<String>,
    tail: VecDeque<String>,
    next_id: u64,
    last_used: Instant,
    renders: u64,
    /// Errors Blender printed while loading the scene (a driver that fails
    /// is reported once, at load): they spoil every render of the session.
    load_errors: Vec<String>,
    /// Warnings for the job: stored Python that did not run.
    warnings: Vec<String>,
}

/// Error lines and the last Python exception printed during one command,
/// and the drivers Blender skipped because auto-run is off (not errors).
#[derive(Default)]
struct Printed {
    errors: Vec<String>,
    exception: Option<String>,
    skipped: SkippedDrivers,
}

impl Printed {
    fn note(&mut self, line: &str) {
        if self.skipped.note(line) {
            return;
        }
        if is_error_line(line) && self.errors.len() < 5 {
            self.errors.push(line.trim().to_string());
        }
        if is_python_exception(line) {
            self.exception = Some(line.trim().to_string());
        }
    }

    /// The error lines, the exception last, deduplicated.
    fn all(mut self) -> Vec<String> {
        if let Some(e) = self.exception.take().filter(|e| !self.errors.contains(e)) {
            self.errors.push(e);
        }
        self.errors
    }
}

impl Session {
    /// Keeps the warnings of `printed` (once each).
    fn note_warnings(&mut self, printed: &Printed) {
        for w in printed.skipped.warnings() {
            if !self.warnings.contains(&w) {
                self.warnings.push(w);
            }
        }
    }

    /// Keeps a line of Blender's output in the tail (and notes it in
    /// `printed`); true when it ended in the session's mark
    /// ([`messages::OUTPUT_MARK`]), which is neither kept nor noted.
    fn take_line(&mut self, line: String, printed: Option<&mut Printed>) -> bool {
        let (line, mark) = without_mark(line);
        if let Some(line) = line {
            if let Some(p) = printed {
                p.note(&line);
            }
            if self.tail.len() == LOG_TAIL_LINES {
                self.tail.pop_front();
            }
            self.tail.push_back(line);
        }
        mark
    }

    fn log_tail(&self) -> String {
        self.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Moves the lines Blender printed into the tail up to the marks the
    /// session writes on stdout and on stderr after its last line of each
    /// ([`messages::OUTPUT_MARK`]), right before it answers `ready`: both
    /// are in their pipes by the time the answer is read, so this takes
    /// about a millisecond, where a fixed wait of 50 ms once stood in for
    /// it. A session that dies meanwhile is read until its pipes close, one
    /// that writes no mark for [`MARKS_WITHIN`] as far as it got. `marks`:
    /// those read already, while waiting for the answer.
    async fn read_to_marks(&mut self, mut marks: usize) {
        let deadline = tokio::time::Instant::now() + MARKS_WITHIN;
        while marks < 2 {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => marks += usize::from(self.take_line(line, None)),
                Ok(None) | Err(_) => break,
            }
        }
        self.drain_lines(None);
    }

    /// Moves lines printed since the last render into the tail.
    fn drain_lines(&mut self, mut printed: Option<&mut Printed>) {
        while let Ok(line) = self.lines.try_recv() {
            self.take_line(line, printed.as_deref_mut());
        }
    }

    /// Writes one command on Blender's stdin.
    async fn send(&mut self, cmd: &Command) -> std::io::Result<()> {
        let line = messages::line(cmd);
        match self.stdin.as_mut() {
            Some(stdin) => {
                stdin.write_all(line.as_bytes()).await?;
                stdin.flush().await
            }
            None => Err(std::io::Error::other("session closed")),
        }
    }

    async fn exit_reason(&mut self) -> String {
        match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(Ok(status)) => format!("Blender exited ({status})"),
            _ => "Blender stopped answering".to_string(),
        }
    }

    /// A crash: what happened, with the error lines and the last lines printed.
    fn crashed(&self, what: String, errors: &[String]) -> RenderFailure {
        let last: Vec<String> = self.tail.iter().rev().take(5).cloned().collect();
        let what = match summarize(errors) {
            Some(e) => format!("{what}: {e}"),
            None => what,
        };
        let words = format!("{}\n{}", errors.join("\n"), last.join("\n"));
        failure(Kind::Crashed, what, &words, self.log_tail())
    }

    /// Renders every frame of `req`, one command each, checking every frame.
    async fn render(
        &mut self,
        req: &RenderRequest,
        progress: &Progress,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Vec<RenderedFrame>, RenderFailure> {
        let mut out = Vec::with_capacity(req.frames.len());
        if let Some(e) = summarize(&self.load_errors) {
            return Err(failure(
                Kind::BlenderError,
                format!("Blender reported an error while loading the scene: {e}"),
                &self.load_errors.join("\n"),
                self.log_tail(),
            ));
        }
        for &frame in &req.frames {
            self.drain_lines(None);
            self.next_id += 1;
            let id = self.next_id;
            let started = verify::mark_start(&req.out_dir, frame).map_err(|e| {
                failure(
                    Kind::WorkerDisk,
                    format!(
                        "cannot write into the task folder {}: {e}",
                        req.out_dir.display()
                    ),
                    "",
                    String::new(),
                )
            })?;
            let cmd = Command::Render(messages::Render {
                id,
                frame,
                output_dir: req.out_dir.clone(),
                threads: req.threads,
                tile: req.tile.as_ref().map(|t| messages::Tile {
                    border: t.border,
                    size: [t.size.0, t.size.1],
                    frame: [t.frame.0, t.frame.1],
                }),
            });
            if self.send(&cmd).await.is_err() {
                let what = format!(
                    "{} before frame {frame} could be rendered",
                    self.exit_reason().await
                );
                return Err(self.crashed(what, &[]));
            }
            progress.samples_done.store(0, Ordering::Relaxed);
            let mut printed = Printed::default();
            let rendered = loop {
                tokio::select! {
                    reply = self.replies.recv() => match reply {
                        None => {
                            self.drain_lines(Some(&mut printed));
                            let what = format!("{} while rendering frame {frame}", self.exit_reason().await);
                            return Err(self.crashed(what, &printed.all()));
                        }
                        Some(r) if r.id() != Some(id) => {}
                        Some(r) => match r {
                            Reply::Progress(p) => {
                                let n = |v: u64| v.min(u64::from(u32::MAX)) as u32;
                                progress.samples_done.store(n(p.samples_done), Ordering::Relaxed);
                                progress.samples_total.store(n(p.samples_total), Ordering::Relaxed);
                            }
                            Reply::Done(done) => break done,
                            Reply::Error(failed) => {
                                self.drain_lines(Some(&mut printed));
                                let e = failed.error;
                                let words = format!("{e}\n{}", printed.all().join("\n"));
                                return Err(failure(
                                    Kind::BlenderError,
                                    format!("Blender could not render frame {frame}: {e}"),
                                    &words,
                                    self.log_tail(),
                                ));
                            }
                            Reply::Ready(_) => {}
                        },
                    },
                    line = self.lines.recv() => if let Some(line) = line {
                        self.take_line(line, Some(&mut printed));
                    },
                    changed = stop.changed() => {
                        if changed.is_err() || *stop.borrow() {
                            return Err(RenderFailure::Stopped);
                        }
                    }
                }
            };
            // Lines printed up to the answer belong to this render.
            self.drain_lines(Some(&mut printed));
            self.note_warnings(&printed);
            let errors = printed.all();
            if let Some(e) = summarize(&errors) {
                return Err(failure(
                    Kind::BlenderError,
                    format!("Blender reported an error while rendering frame {frame}: {e}"),
                    &errors.join("\n"),
                    self.log_tail(),
                ));
            }
            let reported = verify::Reported::from(&rendered);
            let found = verify::inspect(&req.out_dir, &reported.path, started);
            let expected = verify::expected_size(&reported, req.tile.as_ref().map(|t| t.size));
            if let Err(what) = verify::judge(frame, &reported, &found, expected) {
                return Err(failure(Kind::BadFrame, what, "", self.log_tail()));
            }
            let ext = reported
                .path
                .extension()
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase)
                .unwrap_or_default();
            let passes = if req.tile.is_some() {
                Vec::new()
            } else {
                fresh_passes(&req.out_dir, &reported.passes, started)
            };
            self.renders += 1;
            progress.frames.fetch_add(1, Ordering::Relaxed);
            out.push(RenderedFrame {
                frame,
                path: reported.path,
                ext,
                passes,
                warnings: self.warnings.clone(),
            });
        }
        if req.tile.is_some() && req.out_dir.join("passes").is_dir() {
            tracing::info!(
                job = req.job,
                "the scene's File Output passes are not kept for tiled jobs"
            );
        }
        Ok(out)
    }

    /// Asks Blender to quit, and kills it if it has not within a few seconds.
    fn close(mut self, why: &str) {
        tracing::info!(
            job = self.job,
            pid = self.pid,
            renders = self.renders,
            "closing Blender session: {why}"
        );
        drop(self.stdin.take());
        tokio::spawn(async move {
            if tokio::time::timeout(Duration::from_secs(3), self.child.wait())
                .await
                .is_err()
            {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
            }
        });
    }

    /// Kills Blender at once (it is mid-render, failed, or its job is gone).
    fn kill(mut self, why: &str) {
        tracing::info!(
            job = self.job,
            pid = self.pid,
            "ending Blender session: {why}"
        );
        let _ = self.child.start_kill();
        tokio::spawn(async move {
            let _ = self.child.wait().await;
        });
    }
}

/// The passes a render reported that are real files in the task's passes
/// folder, written by this render, with names safe to use anywhere.
fn fresh_passes(
    out_dir: &Path,
    reported: &[(String, PathBuf)],
    started: std::time::SystemTime,
) -> Vec<PassFile> {
    let root = out_dir.join("passes");
    reported
        .iter()
        .filter(|(name, path)| {
            let ok = crate::passes::check_name(name).is_ok()
                && *path == root.join(name)
                && verify::fresh(path, started);
            if !ok {
                tracing::warn!(pass = %name, "extra output left out: not a fresh file of this render");
            }
            ok
        })
        .map(|(name, path)| PassFile {
            name: name.clone(),
            path: path.clone(),
        })
        .collect()
}

/// A line of Blender's output without the session's mark at its end
/// ([`messages::OUTPUT_MARK`]; `None` for the mark alone), and whether the
/// mark was there: it follows a last line printed without its newline.
fn without_mark(line: String) -> (Option<String>, bool) {
    match line.strip_suffix(messages::OUTPUT_MARK) {
        Some("") => (None, true),
        Some(rest) => (Some(rest.to_string()), true),
        None => (Some(line), false),
    }
}

/// The longest a loaded session's output is read for its marks (see
/// `Session::read_to_marks`); they come within a millisecond or two.
const MARKS_WITHIN: Duration = Duration::from_secs(1);

/// How long a slot stays without a render before a spare Blender is
/// started for it: long enough that a task following at once (the next of a
/// `--fresh-process` worker, a job's next chunk) does not pay for a spare it
/// will not use, or a command that is about to exit for one it kills.
const SPARE_AFTER: Duration = Duration::from_secs(1);

/// Starts Blender processes for a [`SessionRenderer`].
#[derive(Clone)]
struct Launcher {
    dir: PathBuf,
    script: PathBuf,
    bpy_run: PathBuf,
    /// Slots whose first Blender has started (for `fail_first_render`).
    #[cfg(feature = "test-hooks")]
    first_started: Arc<Mutex<std::collections::HashSet<u32>>>,
    #[cfg(feature = "test-hooks")]
    fail_first_render: bool,
}

impl Launcher {
    /// The slot's folder for Blender's temporary files, created.
    fn tmp(&self, slot: u32) -> Result<PathBuf, String> {
        let tmp = self.dir.join("blender-tmp").join(slot.to_string());
        std::fs::create_dir_all(&tmp)
            .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        Ok(tmp)
    }

    /// Starts Blender for `slot` as `launch` says: on `opening`'s scene, or
    /// with none as a spare (`--spare`) that waits for an `open` command.
    fn spawn(
        &self,
        slot: u32,
        launch: &Launch,
        opening: Option<&Opening>,
    ) -> Result<Session, RenderFailure> {
        let disk = |what: String| failure(Kind::WorkerDisk, what, "", String::new());
        let tmp = self.tmp(slot).map_err(disk)?;
        let (reader, writer) =
            std::io::pipe().map_err(|e| disk(format!("cannot create a pipe for Blender: {e}")))?;
        #[cfg(feature = "test-hooks")]
        let fail_renders =
            self.fail_first_render && self.first_started.lock().unwrap().insert(slot);
        #[cfg(not(feature = "test-hooks"))]
        let fail_renders = false;
        let mut cmd = launch.runtime.command(
            opening.map(|o| o.scene.as_path()),
            &self.script,
            &self.bpy_run,
            launch.scene_python,
        );
        cmd.args([
            "--reply-fd",
            "3",
            "--cycles-device",
            launch.device.cycles_name(),
        ])
        .args(fail_renders.then_some("--fail-first-render"))
        .args(opening.is_none().then_some("--spare"));
        if let Some((root, mappings)) = opening.and_then(|o| o.root.as_ref()) {
            cmd.arg("--job-root")
                .arg(root)
                .arg("--mappings")
                .arg(mappings);
        }
        cmd.env_clear()
            .envs(crate::isolation::blender_env(std::env::vars_os(), &tmp))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        {
            use std::os::fd::AsRawFd;
            child_setup(&mut cmd, Some(writer.as_raw_fd()));
        }
        crate::blender::pin_gpu(&mut cmd, launch.device, launch.gpu_uuid.as_deref());
        let mut child = cmd.spawn().map_err(|e| {
            failure(
                Kind::WorkerDisk,
                format!("cannot start Blender ({}): {e}", launch.runtime.describe()),
                "",
                String::new(),
            )
        })?;
        drop(writer);
        let pid = child.id().unwrap_or(0);
        let stdin = child.stdin.take();
        let lines = read_lines(&mut child);
        let (reply_tx, replies) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                match messages::read(&line) {
                    Ok(reply) => {
                        if reply_tx.send(reply).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!("unreadable answer from the Blender session: {e}: {line}")
                    }
                }
            }
        });
        Ok(Session {
            job: 0,
            launch: launch.clone(),
            scene: opening.map(|o| o.scene.clone()).unwrap_or_default(),
            pid,
            child,
            stdin,
            replies,
            lines,
            tail: VecDeque::with_capacity(LOG_TAIL_LINES),
            next_id: 0,
            last_used: Instant::now(),
            renders: 0,
            load_errors: Vec::new(),
            warnings: Vec::new(),
        })
    }
}

/// A slot's spare Blender: started before its task is known, so that a
/// job's first task on the slot does not wait for Blender to start (about
/// half a second of the 0.5-0.7 s a fresh Blender takes to render a small
/// frame here is the process start, not the scene).
struct SlotSpare {
    /// What the slot's next Blender is likely to be started with: the last
    /// task's choice, or the slot's device and the first runtime.
    launch: Launch,
    /// Started with `launch`, waiting for its scene.
    spare: Option<Session>,
    /// Since when the slot has had no render (`None` while one runs).
    idle_since: Option<Instant>,
}

impl SlotSpare {
    /// `slot`'s entry in `spares` (a new one, with no spare, when it has
    /// none), its next spare to be started as `launch` says.
    fn of<'a>(
        spares: &'a mut HashMap<u32, SlotSpare>,
        slot: u32,
        launch: &Launch,
    ) -> &'a mut SlotSpare {
        let entry = spares.entry(slot).or_insert_with(|| SlotSpare {
            launch: launch.clone(),
            spare: None,
            idle_since: None,
        });
        entry.launch = launch.clone();
        entry
    }
}

/// Renders in Blender sessions, one per slot.
pub struct SessionRenderer {
    config: SessionConfig,
    launcher: Launcher,
    slots: Arc<Mutex<HashMap<u32, Session>>>,
    spares: Arc<Mutex<HashMap<u32, SlotSpare>>>,
}

impl SessionRenderer {
    /// A renderer run as `config` says. The session script is written to
    /// `config.dir`. Must be called inside a Tokio runtime.
    pub fn new(config: SessionConfig) -> Result<Self, Error> {
        let dir = &config.dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        let script = dir.join("tessera_session.py");
        // remap.py (and deps.py, which it imports) rewrite a file set's
        // absolute references at load, and cycles_progress.py reads Cycles'
        // progress lines; they sit beside the session script.
        let bpy_run = dir.join("bpy_run.py");
        for (path, text) in [
            (script.clone(), SCRIPT),
            (bpy_run.clone(), crate::runtime::BPY_RUN),
            (dir.join("remap.py"), REMAP),
            (dir.join("deps.py"), DEPS),
            (dir.join("cycles_progress.py"), CYCLES_PROGRESS),
        ] {
            std::fs::write(&path, text)
                .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))?;
        }
        let launcher = Launcher {
            dir: dir.clone(),
            script,
            bpy_run,
            #[cfg(feature = "test-hooks")]
            first_started: Arc::default(),
            #[cfg(feature = "test-hooks")]
            fail_first_render: config.fail_first_render,
        };
        let slots: Arc<Mutex<HashMap<u32, Session>>> = Arc::default();
        let spares: Arc<Mutex<HashMap<u32, SlotSpare>>> = Arc::default();
        let (weak, weak_spares) = (Arc::downgrade(&slots), Arc::downgrade(&spares));
        let idle = config.idle;
        let make_spares = config.spare.then(|| launcher.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500).min(idle));
            loop {
                tick.tick().await;
                let (Some(slots), Some(spares)) = (weak.upgrade(), weak_spares.upgrade()) else {
                    return;
                };
                let idle_ones: Vec<Session> = {
                    let mut slots = slots.lock().unwrap();
                    let keys: Vec<u32> = slots
                        .iter()
                        .filter(|(_, s)| s.last_used.elapsed() >= idle)
                        .map(|(k, _)| *k)
                        .collect();
                    keys.into_iter().filter_map(|k| slots.remove(&k)).collect()
                };
                for s in idle_ones {
                    s.close("idle");
                }
                if let Some(launcher) = &make_spares {
                    refill_spares(launcher, &slots, &spares);
                }
            }
        });
        Ok(Self {
            config,
            launcher,
            slots,
            spares,
        })
    }

    /// Loads the task's scene in a Blender for its slot (the slot's spare
    /// when it was started as the task asks, else a new one) and waits for
    /// the session to be ready.
    async fn start(
        &self,
        req: &RenderRequest,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Session, RenderFailure> {
        let launch = Launch::of(req, self.runtime_for(req)?);
        let disk = |what: String| failure(Kind::WorkerDisk, what, "", String::new());
        let tmp = self.launcher.tmp(req.slot).map_err(disk)?;
        let opening = Opening {
            scene: req.scene.clone(),
            root: write_mappings(req, &tmp).map_err(disk)?,
        };
        let started = Instant::now();
        let mut from_spare = false;
        let mut session = match self.take_spare(req.slot, &launch) {
            Some(mut spare) => {
                let open = Command::Open(messages::Open {
                    scene: opening.scene.clone(),
                    job_root: opening.root.as_ref().map(|(r, _)| r.clone()),
                    mappings: opening.root.as_ref().map(|(_, m)| m.clone()),
                    scene_python: launch.scene_python,
                });
                match spare.send(&open).await {
                    Ok(()) => {
                        from_spare = true;
                        spare.scene = opening.scene.clone();
                        spare
                    }
                    Err(e) => {
                        spare.kill(&format!("the spare did not take its scene ({e})"));
                        self.launcher.spawn(req.slot, &launch, Some(&opening))?
                    }
                }
            }
            None => self.launcher.spawn(req.slot, &launch, Some(&opening))?,
        };
        session.job = req.job;
        session.last_used = Instant::now();
        let pid = session.pid;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        // The session's marks after its output (see `read_to_marks`).
        let mut marks = 0;
        let ready = loop {
            tokio::select! {
                reply = session.replies.recv() => match reply {
                    Some(Reply::Ready(ready)) => break ready,
                    Some(_) => {}
                    None => {
                        // Let the last lines of output arrive before reporting.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let mut printed = Printed::default();
                        for l in &session.tail {
                            printed.note(l);
                        }
                        session.drain_lines(Some(&mut printed));
                        let what = format!("{} while loading the scene", session.exit_reason().await);
                        return Err(session.crashed(what, &printed.all()));
                    }
                },
                line = session.lines.recv() => if let Some(line) = line {
                    marks += usize::from(session.take_line(line, None));
                },
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        session.kill("stopped while loading");
                        return Err(RenderFailure::Stopped);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let what = format!("Blender did not load the scene within {READY_TIMEOUT:?}");
                    let f = session.crashed(what, &[]);
                    session.kill("too slow to load");
                    return Err(f);
                }
            }
        };
        // What the load printed, every line of it: the session marks the
        // end of each stream before it answers.
        session.read_to_marks(marks).await;
        let mut printed = Printed::default();
        for l in &session.tail {
            printed.note(l);
        }
        session.note_warnings(&printed);
        session.load_errors = printed.all();
        if let Some(f) = refuse_scene(&ready, &session.log_tail())
            .or_else(|| crate::output_size::refuse(&ready, req, &session.log_tail()))
        {
            session.kill("the scene cannot be rendered here");
            return Err(f);
        }
        if let Some(skipped) = &ready.scripts_skipped {
            tracing::warn!(
                job = req.job,
                "the scene's stored Python was not run (workers run Blender with --disable-autoexec): {skipped}"
            );
        }
        session
            .warnings
            .extend(crate::scene_python::scripts_warning(&ready.scripts));
        tracing::info!(
            job = req.job,
            slot = req.slot,
            pid,
            spare = from_spare,
            ms = started.elapsed().as_millis() as u64,
            "Blender session started"
        );
        Ok(session)
    }

    /// The slot's spare Blender, when it runs and was started as `launch`
    /// says (one started otherwise is ended). `launch` becomes what the
    /// slot's next spare is started with.
    fn take_spare(&self, slot: u32, launch: &Launch) -> Option<Session> {
        let mut spares = self.spares.lock().unwrap();
        let mut spare = SlotSpare::of(&mut spares, slot, launch).spare.take()?;
        let alive = spare.child.try_wait().ok().flatten().is_none();
        if alive && spare.launch == *launch {
            Some(spare)
        } else {
            drop(spares);
            spare.kill(if alive {
                "the task asks for another Blender, device or Python policy"
            } else {
                "the spare Blender exited"
            });
            None
        }
    }

    /// Starts a spare Blender for `slot` as `launch` says, unless it has one
    /// started so (one started otherwise is ended) or the worker keeps none.
    fn spare_ahead(&self, slot: u32, launch: &Launch) {
        if !self.config.spare {
            return;
        }
        let mut spares = self.spares.lock().unwrap();
        let entry = SlotSpare::of(&mut spares, slot, launch);
        if let Some(other) = entry.spare.take_if(|s| s.launch != *launch) {
            other.kill("the slot's next task asks for another Blender, device or Python policy");
        }
        if entry.spare.is_none() {
            entry.spare = start_spare(&self.launcher, slot, launch);
        }
    }

    /// Marks `slot` busy until the returned guard drops.
    fn busy(&self, slot: u32) -> Busy<'_> {
        if let Some(s) = self.spares.lock().unwrap().get_mut(&slot) {
            s.idle_since = None;
        }
        Busy {
            spares: &self.spares,
            slot,
        }
    }
}

/// A slot with a render running; when it drops, the slot is idle from then.
struct Busy<'a> {
    spares: &'a Mutex<HashMap<u32, SlotSpare>>,
    slot: u32,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.spares.lock().unwrap().get_mut(&self.slot) {
            s.idle_since = Some(Instant::now());
        }
    }
}

/// Starts a spare Blender for each slot idle for [`SPARE_AFTER`] that has
/// neither a spare nor a warm session.
fn refill_spares(
    launcher: &Launcher,
    slots: &Mutex<HashMap<u32, Session>>,
    spares: &Mutex<HashMap<u32, SlotSpare>>,
) {
    let warm: Vec<u32> = slots.lock().unwrap().keys().copied().collect();
    let mut spares = spares.lock().unwrap();
    for (&slot, s) in spares.iter_mut() {
        let due = s.idle_since.is_some_and(|t| t.elapsed() >= SPARE_AFTER);
        if s.spare.is_none() && due && !warm.contains(&slot) {
            s.spare = start_spare(launcher, slot, &s.launch);
            if s.spare.is_none() {
                // Not again until the slot has rendered.
                s.idle_since = None;
            }
        }
    }
}

/// A spare Blender for `slot`, or `None` (logged) when it cannot start.
fn start_spare(launcher: &Launcher, slot: u32, launch: &Launch) -> Option<Session> {
    match launcher.spawn(slot, launch, None) {
        Ok(s) => {
            tracing::info!(
                slot,
                pid = s.pid,
                "spare Blender started ({})",
                launch.runtime.describe()
            );
            Some(s)
        }
        Err(e) => {
            tracing::warn!(slot, "cannot start a spare Blender: {e:?}");
            None
        }
    }
}

impl SessionRenderer {
    /// The runtime of the Blender version `blender` names, or the first one
    /// when it names none (a coordinator that does not choose).
    fn runtime_named(&self, blender: Option<&str>) -> Option<crate::runtime::Runtime> {
        let offered = &self.config.runtimes;
        let found = match blender {
            None | Some("") => offered.first(),
            Some(v) => offered.iter().find(|o| o.caps.version == v),
        };
        found.map(|o| o.runtime.clone())
    }

    /// The runtime the task asks for, or why this worker has none.
    fn runtime_for(&self, req: &RenderRequest) -> Result<crate::runtime::Runtime, RenderFailure> {
        let offered = &self.config.runtimes;
        self.runtime_named(req.blender.as_deref()).ok_or_else(|| {
            let have: Vec<&str> = offered.iter().map(|o| o.caps.version.as_str()).collect();
            failure(
                Kind::WorkerDisk,
                format!(
                    "this worker has no Blender {} (it offers {}); restart it with `--blender {}`",
                    req.blender.as_deref().unwrap_or("?"),
                    have.join(", "),
                    req.blender.as_deref().unwrap_or("?"),
                ),
                "",
                String::new(),
            )
        })
    }
}

/// For a job with a file set: its root, and the file its mappings are
/// written to as JSON (in `tmp`), which Blender reads at load
/// (`--job-root DIR --mappings FILE`); nothing for a self-contained scene.
fn write_mappings(
    req: &RenderRequest,
    tmp: &std::path::Path,
) -> Result<Option<(PathBuf, PathBuf)>, String> {
    let Some(root) = &req.root else {
        return Ok(None);
    };
    let map: std::collections::BTreeMap<&str, String> = root
        .mappings
        .iter()
        .map(|(from, to)| (from.as_str(), to.to_string_lossy().into_owned()))
        .collect();
    let file = tmp.join("mappings.json");
    let text = serde_json::to_string(&map).expect("a map of strings serializes");
    std::fs::write(&file, text).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    Ok(Some((root.root.clone(), file)))
}

/// Why a loaded scene must not be rendered on any worker, from the session's
/// `ready` answer: it reads files outside the job, or a newer Blender saved it.
fn refuse_scene(ready: &messages::Ready, log_tail: &str) -> Option<RenderFailure> {
    let outside: Vec<String> = ready
        .outside
        .iter()
        .map(|f| {
            if f.missing {
                format!("{} (missing here too)", f.path)
            } else {
                f.path.clone()
            }
        })
        .collect();
    if !outside.is_empty() {
        return Some(failure(
            Kind::OutsideFiles,
            format!(
                "the scene refers to {} file(s) outside the job, which workers do not read from their own disks: {}",
                outside.len(),
                outside.join(", ")
            ),
            "",
            log_tail.to_string(),
        ));
    }
    if let Some(newer) = &ready.newer {
        return Some(failure(
            Kind::NewerBlender,
            format!(
                "the scene was saved by Blender {newer}, newer than this worker's Blender {}",
                ready.blender
            ),
            "",
            log_tail.to_string(),
        ));
    }
    None
}

impl Renderer for SessionRenderer {
    async fn render(
        &self,
        req: RenderRequest,
        progress: Arc<Progress>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Vec<RenderedFrame>, RenderFailure> {
        let _busy = self.busy(req.slot);
        let held = self.slots.lock().unwrap().remove(&req.slot);
        let reusable = match held {
            Some(mut s) => {
                let alive = s.child.try_wait().ok().flatten().is_none();
                let same_runtime = self.runtime_for(&req).is_ok_and(|r| r == s.launch.runtime);
                if alive
                    && s.job == req.job
                    && s.scene == req.scene
                    && s.launch.device == req.device
                    && same_runtime
                {
                    Some(s)
                } else {
                    s.close(if alive {
                        "the slot moved to another job"
                    } else {
                        "Blender exited"
                    });
                    None
                }
            }
            None => None,
        };
        let mut session = match reusable {
            Some(s) => s,
            None => self.start(&req, &mut stop).await?,
        };
        if !self.config.reuse {
            // One Blender per task: the next task's starts while this one renders.
            self.spare_ahead(req.slot, &session.launch);
        }
        let pid = session.pid;
        match session.render(&req, &progress, &mut stop).await {
            Ok(frames) => {
                tracing::info!(job = req.job, slot = req.slot, pid, frames = ?req.frames, "rendered in warm session");
                session.last_used = Instant::now();
                if self.config.reuse {
                    self.slots.lock().unwrap().insert(req.slot, session);
                } else {
                    session.close("one Blender per task (--fresh-process)");
                }
                Ok(frames)
            }
            Err(f) => {
                session.kill(if matches!(f, RenderFailure::Stopped) {
                    "render stopped"
                } else {
                    "its render failed, and a failed session is never reused"
                });
                Err(f)
            }
        }
    }

    fn warm_job(&self, slot: u32) -> Option<u64> {
        self.slots.lock().unwrap().get(&slot).map(|s| s.job)
    }

    fn prepare(&self, slot: u32, device: crate::blender::Device, gpu_uuid: Option<&str>) {
        let Some(first) = self.config.runtimes.first() else {
            return;
        };
        if self.spares.lock().unwrap().contains_key(&slot) {
            return;
        }
        let launch = Launch {
            runtime: first.runtime.clone(),
            device,
            gpu_uuid: gpu_uuid.map(str::to_string),
            scene_python: self.config.spare_scene_python,
        };
        self.spare_ahead(slot, &launch);
    }

    fn expect(&self, slot: u32, next: &crate::blender::NextLaunch) {
        // A version this worker lacks fails when the task starts, saying so.
        let Some(runtime) = self.runtime_named(next.blender.as_deref()) else {
            return;
        };
        // The task will not find the slot's session warm for its job: its
        // Blender boots now, while the current render runs, and waits.
        self.spare_ahead(
            slot,
            &Launch {
                runtime,
                device: next.device,
                gpu_uuid: next.gpu_uuid.clone(),
                scene_python: next.scene_python,
            },
        );
    }

    fn end_jobs(&self, jobs: &[u64]) {
        let ended: Vec<Session> = {
            let mut slots = self.slots.lock().unwrap();
            let keys: Vec<u32> = slots
                .iter()
                .filter(|(_, s)| jobs.contains(&s.job))
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter().filter_map(|k| slots.remove(&k)).collect()
        };
        for s in ended {
            s.kill("its job ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Scope;

    fn scope(f: Option<RenderFailure>) -> Option<Scope> {
        match f? {
            RenderFailure::Failed { scope, .. } => Some(scope),
            RenderFailure::Stopped | RenderFailure::NoRoom(_) => None,
        }
    }

    /// A `ready` answer with these outside files and newer version.
    fn ready(outside: serde_json::Value, newer: Option<&str>) -> messages::Ready {
        let line = serde_json::json!({"event": "ready", "pid": 1, "blender": "3.4.1",
            "engine": "CYCLES", "outside": outside, "newer": newer, "scripts_skipped": null,
            "scripts": [], "width": 64, "height": 48});
        match messages::read(&line.to_string()).unwrap() {
            Reply::Ready(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_sessions_mark_is_told_apart_from_blenders_output() {
        let mark = messages::OUTPUT_MARK;
        assert_eq!(without_mark(mark.into()), (None, true));
        // After a last line printed without its newline.
        assert_eq!(
            without_mark(format!("Fra:1 Sample 3/16{mark}")),
            (Some("Fra:1 Sample 3/16".into()), true)
        );
        assert_eq!(
            without_mark("Read blend: /s.blend".into()),
            (Some("Read blend: /s.blend".into()), false)
        );
        // Only at a line's end: anything else is Blender's.
        let inside = format!("{mark} and more");
        assert_eq!(without_mark(inside.clone()), (Some(inside), false));
    }

    #[test]
    fn scenes_reading_outside_files_or_from_a_newer_blender_are_refused_everywhere() {
        let ready = ready(
            serde_json::json!([
                {"path": "/mnt/tex/wood.png", "missing": false},
                {"path": "/gone.png", "missing": true}
            ]),
            None,
        );
        let f = refuse_scene(&ready, "").unwrap();
        let RenderFailure::Failed { reason, .. } = &f else {
            panic!("{f:?}")
        };
        assert!(
            reason.contains("/mnt/tex/wood.png, /gone.png (missing here too)"),
            "{reason}"
        );
        assert_eq!(scope(Some(f)), Some(Scope::Everywhere));
        let newer = self::ready(serde_json::json!([]), Some("4.2.0"));
        assert_eq!(scope(refuse_scene(&newer, "")), Some(Scope::Everywhere));
        let fine = self::ready(serde_json::json!([]), None);
        assert!(refuse_scene(&fine, "").is_none());
    }

    #[test]
    fn only_fresh_passes_with_safe_names_in_the_passes_folder_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("passes");
        std::fs::create_dir_all(root.join("n")).unwrap();
        let started = verify::mark_start(dir.path(), 1).unwrap();
        std::fs::write(root.join("n/Image0001.png"), b"png").unwrap();
        let got = fresh_passes(
            dir.path(),
            &[
                ("n/Image0001.png".into(), root.join("n/Image0001.png")),
                (
                    "../frame_0001.png".into(),
                    dir.path().join("frame_0001.png"),
                ),
                ("n/missing.png".into(), root.join("n/missing.png")),
                ("n/x.png".into(), PathBuf::from("/etc/hostname")),
            ],
            started,
        );
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].name, "n/Image0001.png");
    }
}
