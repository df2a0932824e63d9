//! Warm Blender sessions: one long-lived Blender per (job, slot) that renders
//! frame after frame with Cycles' persistent data, instead of paying process
//! start, scene load and BVH build for every task.
//!
//! The worker starts `blender -b SCENE --python-exit-code 3 --python session.py
//! -- --reply-fd 3`, writes one JSON render command per line on Blender's
//! stdin, and reads the answers on a pipe of their own (fd 3 in Blender), never
//! from Blender's stdout. Stdout and stderr are still read: they fill the log
//! tail sent with a failure, and error lines printed during a render (a Python
//! driver failing, a file that cannot be saved) fail that render even though
//! Blender carries on.
//!
//! A session is kept while its slot receives tasks of the same job; it is
//! closed when the slot moves to another job, when it has been idle for the
//! configured time, when its job ends, and when Blender dies (the render in
//! flight then fails with Blender's log tail, and the next task starts afresh).

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};

use crate::blender::{
    child_setup, failure, is_error_line, is_python_exception, read_lines, summarize, Progress,
    RenderFailure, RenderRequest, RenderedFrame, Renderer,
};
use crate::error::Error;

/// The session script, shipped inside the binary so a worker needs no checkout.
const SCRIPT: &str = include_str!("../../blender/session.py");

/// Lines of Blender's output kept for a failure report.
const LOG_TAIL_LINES: usize = 80;

/// How long Blender may take to load a scene before the session is given up.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// One running Blender serving one job on one slot.
struct Session {
    job: u64,
    device: crate::blender::Device,
    scene: PathBuf,
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    replies: mpsc::UnboundedReceiver<Value>,
    lines: mpsc::UnboundedReceiver<String>,
    tail: VecDeque<String>,
    next_id: u64,
    last_used: Instant,
    renders: u64,
    /// Errors Blender printed while loading the scene (a driver that fails
    /// is reported once, at load): they spoil every render of the session.
    load_errors: Vec<String>,
}

/// Why a render in a session did not produce its frames.
enum SessionError {
    /// This render failed; the session can serve the next one.
    Render(RenderFailure),
    /// The session is unusable (Blender died, was stopped, or broke the protocol).
    Broken(RenderFailure),
}

impl Session {
    fn push_line(&mut self, line: String) {
        if self.tail.len() == LOG_TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    fn log_tail(&self) -> String {
        self.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Moves lines printed since the last render into the tail.
    fn drain_lines(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.push_line(line);
        }
    }

    async fn exit_reason(&mut self) -> String {
        match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(Ok(status)) => format!("Blender exited ({status})"),
            _ => "Blender stopped answering".to_string(),
        }
    }

    /// Renders every frame of `req`, one command each.
    async fn render(
        &mut self,
        req: &RenderRequest,
        progress: &Progress,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Vec<RenderedFrame>, SessionError> {
        let mut out = Vec::with_capacity(req.frames.len());
        if let Some(e) = summarize(&self.load_errors) {
            return Err(SessionError::Render(failure(
                format!("Blender reported an error while loading the scene: {e}"),
                self.log_tail(),
            )));
        }
        for &frame in &req.frames {
            self.drain_lines();
            self.next_id += 1;
            let id = self.next_id;
            let tile = req.tile.as_ref().map(|t| {
                json!({
                    "border": t.border,
                    "size": [t.size.0, t.size.1],
                    "frame": [t.frame.0, t.frame.1],
                })
            });
            let cmd = json!({
                "cmd": "render",
                "id": id,
                "frame": frame,
                "output_dir": req.out_dir,
                "threads": req.threads,
                "tile": tile,
            });
            let mut line = cmd.to_string();
            line.push('\n');
            let sent = match self.stdin.as_mut() {
                Some(stdin) => stdin
                    .write_all(line.as_bytes())
                    .await
                    .and(stdin.flush().await),
                None => Err(std::io::Error::other("session closed")),
            };
            if sent.is_err() {
                let reason = format!(
                    "{} before frame {frame} could be rendered",
                    self.exit_reason().await
                );
                return Err(SessionError::Broken(failure(reason, self.log_tail())));
            }
            progress.samples_done.store(0, Ordering::Relaxed);
            let mut errors: Vec<String> = Vec::new();
            let mut exception: Option<String> = None;
            let rendered = loop {
                tokio::select! {
                    reply = self.replies.recv() => match reply {
                        None => {
                            self.drain_lines();
                            let reason = format!("{} while rendering frame {frame}", self.exit_reason().await);
                            let reason = match summarize(&errors) {
                                Some(e) => format!("{reason}: {e}"),
                                None => reason,
                            };
                            return Err(SessionError::Broken(failure(reason, self.log_tail())));
                        }
                        Some(v) if v["id"].as_u64() != Some(id) => {}
                        Some(v) => match v["event"].as_str() {
                            Some("progress") => {
                                let n = |k: &str| v[k].as_u64().unwrap_or(0).min(u64::from(u32::MAX)) as u32;
                                progress.samples_done.store(n("samples_done"), Ordering::Relaxed);
                                progress.samples_total.store(n("samples_total"), Ordering::Relaxed);
                            }
                            Some("done") => break v,
                            Some("error") => {
                                self.drain_lines();
                                let e = v["error"].as_str().unwrap_or("unknown error").to_string();
                                return Err(SessionError::Render(failure(
                                    format!("Blender could not render frame {frame}: {e}"),
                                    self.log_tail(),
                                )));
                            }
                            _ => {}
                        },
                    },
                    line = self.lines.recv() => if let Some(line) = line {
                        if is_error_line(&line) && errors.len() < 5 {
                            errors.push(line.trim().to_string());
                        }
                        if is_python_exception(&line) {
                            exception = Some(line.trim().to_string());
                        }
                        self.push_line(line);
                    },
                    changed = stop.changed() => {
                        if changed.is_err() || *stop.borrow() {
                            return Err(SessionError::Broken(RenderFailure::Stopped));
                        }
                    }
                }
            };
            // Lines printed up to the answer belong to this render.
            while let Ok(line) = self.lines.try_recv() {
                if is_error_line(&line) && errors.len() < 5 {
                    errors.push(line.trim().to_string());
                }
                if is_python_exception(&line) {
                    exception = Some(line.trim().to_string());
                }
                self.push_line(line);
            }
            if let Some(e) = exception.filter(|e| !errors.contains(e)) {
                errors.push(e);
            }
            if let Some(e) = summarize(&errors) {
                return Err(SessionError::Render(failure(
                    format!("Blender reported an error while rendering frame {frame}: {e}"),
                    self.log_tail(),
                )));
            }
            let path = PathBuf::from(rendered["path"].as_str().unwrap_or_default());
            let ext = path
                .extension()
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase)
                .unwrap_or_default();
            if !path.starts_with(&req.out_dir) || ext.is_empty() || !path.is_file() {
                return Err(SessionError::Broken(failure(
                    format!(
                        "the session reported `{}` for frame {frame}, which is not a fresh image",
                        path.display()
                    ),
                    self.log_tail(),
                )));
            }
            if let Some(tile) = &req.tile {
                let got = crate::image_size::image_size(&path)
                    .map_err(|e| SessionError::Render(failure(e, self.log_tail())))?;
                if got != tile.size {
                    return Err(SessionError::Render(failure(
                        format!(
                            "tile of frame {frame} came out {}x{} but should be {}x{}; Blender rounded the border differently than expected",
                            got.0, got.1, tile.size.0, tile.size.1
                        ),
                        self.log_tail(),
                    )));
                }
            }
            self.renders += 1;
            progress.frames.fetch_add(1, Ordering::Relaxed);
            out.push(RenderedFrame { frame, path, ext });
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

    /// Kills Blender at once (it is mid-render, or its job is gone).
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

/// Renders in warm Blender sessions, one per slot.
pub struct SessionRenderer {
    blender: PathBuf,
    script: PathBuf,
    slots: Arc<Mutex<HashMap<u32, Session>>>,
}

impl SessionRenderer {
    /// A renderer whose sessions close after `idle` without work. The session
    /// script is written to `dir`. Must be called inside a Tokio runtime.
    pub fn new(blender: PathBuf, dir: &Path, idle: Duration) -> Result<Self, Error> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        let script = dir.join("tessera_session.py");
        std::fs::write(&script, SCRIPT)
            .map_err(|e| Error::io(format!("cannot write {}", script.display()), e))?;
        let slots: Arc<Mutex<HashMap<u32, Session>>> = Arc::default();
        let weak = Arc::downgrade(&slots);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500).min(idle));
            loop {
                tick.tick().await;
                let Some(slots) = weak.upgrade() else { return };
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
            }
        });
        Ok(Self {
            blender,
            script,
            slots,
        })
    }

    /// Starts Blender on the scene and waits for the session to be ready.
    async fn start(
        &self,
        req: &RenderRequest,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Session, RenderFailure> {
        let (reader, writer) = std::io::pipe().map_err(|e| {
            failure(
                format!("cannot create a pipe for Blender: {e}"),
                String::new(),
            )
        })?;
        let mut cmd = Command::new(&self.blender);
        cmd.arg("-b")
            .arg(&req.scene)
            .args(["--python-exit-code", "3", "--python"])
            .arg(&self.script)
            .args([
                "--",
                "--reply-fd",
                "3",
                "--cycles-device",
                req.device.cycles_name(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        {
            use std::os::fd::AsRawFd;
            child_setup(&mut cmd, Some(writer.as_raw_fd()));
        }
        crate::blender::pin_gpu(&mut cmd, req);
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(|e| {
            failure(
                format!("cannot start Blender `{}`: {e}", self.blender.display()),
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
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => {
                        if reply_tx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!("unreadable answer from the Blender session: {e}: {line}")
                    }
                }
            }
        });
        let mut session = Session {
            job: req.job,
            device: req.device,
            scene: req.scene.clone(),
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
        };
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let ready = loop {
            tokio::select! {
                reply = session.replies.recv() => match reply {
                    Some(v) if v["event"] == "ready" => break v,
                    Some(_) => {}
                    None => {
                        // Let the last lines of output arrive before reporting.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        session.drain_lines();
                        let errors: Vec<String> = session.tail.iter().filter(|l| is_error_line(l) || is_python_exception(l)).cloned().collect();
                        let mut reason = format!("{} while loading the scene", session.exit_reason().await);
                        if let Some(e) = summarize(&errors) {
                            reason = format!("{reason}: {e}");
                        }
                        return Err(failure(reason, session.log_tail()));
                    }
                },
                line = session.lines.recv() => if let Some(line) = line { session.push_line(line) },
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        session.kill("stopped while loading");
                        return Err(RenderFailure::Stopped);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let tail = session.log_tail();
                    session.kill("too slow to load");
                    return Err(failure(format!("Blender did not load the scene within {READY_TIMEOUT:?}"), tail));
                }
            }
        };
        // Output printed before the answer may still be in its pipe.
        tokio::time::sleep(Duration::from_millis(50)).await;
        session.drain_lines();
        let mut load_errors: Vec<String> = session
            .tail
            .iter()
            .filter(|l| is_error_line(l))
            .cloned()
            .collect();
        if let Some(e) = session.tail.iter().rev().find(|l| is_python_exception(l)) {
            if !load_errors.contains(e) {
                load_errors.push(e.clone());
            }
        }
        session.load_errors = load_errors;
        let missing: Vec<String> = ready["missing"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if !missing.is_empty() {
            let tail = session.log_tail();
            session.kill("scene has missing files");
            return Err(RenderFailure::Failed {
                reason: format!(
                    "the scene refers to {} file(s) that do not exist, which Blender would silently render without: {}; pack them into the .blend (File > External Data > Pack Resources) and submit again",
                    missing.len(),
                    missing.join(", ")
                ),
                log_tail: tail,
                permanent: true,
            });
        }
        tracing::info!(
            job = req.job,
            slot = req.slot,
            pid,
            ms = started.elapsed().as_millis() as u64,
            "Blender session started"
        );
        Ok(session)
    }
}

impl Renderer for SessionRenderer {
    async fn render(
        &self,
        req: RenderRequest,
        progress: Arc<Progress>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Vec<RenderedFrame>, RenderFailure> {
        let held = self.slots.lock().unwrap().remove(&req.slot);
        let reusable = match held {
            Some(mut s) => {
                let alive = s.child.try_wait().ok().flatten().is_none();
                if alive && s.job == req.job && s.scene == req.scene && s.device == req.device {
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
        let pid = session.pid;
        match session.render(&req, &progress, &mut stop).await {
            Ok(frames) => {
                tracing::info!(job = req.job, slot = req.slot, pid, frames = ?req.frames, "rendered in warm session");
                session.last_used = Instant::now();
                self.slots.lock().unwrap().insert(req.slot, session);
                Ok(frames)
            }
            Err(SessionError::Render(f)) => {
                session.last_used = Instant::now();
                self.slots.lock().unwrap().insert(req.slot, session);
                Err(f)
            }
            Err(SessionError::Broken(f)) => {
                session.kill(if matches!(f, RenderFailure::Stopped) {
                    "render stopped"
                } else {
                    "session broken"
                });
                Err(f)
            }
        }
    }

    fn warm_job(&self, slot: u32) -> Option<u64> {
        self.slots.lock().unwrap().get(&slot).map(|s| s.job)
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
