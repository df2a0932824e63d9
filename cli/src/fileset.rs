//! A job's file set, built at submit: the scene's external files are traced
//! with Blender itself (`blender/deps.py`: Blender already knows every kind of
//! path a scene can hold, through linked libraries, and a `.blend` reader in
//! Rust would have to track every DNA version to do the same) and laid out
//! under the job root. Hashing and uploading them is [`crate::upload`]'s.
//!
//! The job root mirrors the artist's folders from the deepest folder holding
//! the scene and every file it uses, so relative (`//`) paths, even ones that
//! climb above the scene's folder, resolve unchanged on a worker. Absolute
//! paths are listed as mappings to the same file under the root; the worker's
//! Blender session rewrites them at load. The artist's files are never
//! modified. Knows nothing of the coordinator.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The tracing script, written next to a temporary file when run.
const DEPS_SCRIPT: &str = include_str!("../../blender/deps.py");

/// What `blender/deps.py` reports about a scene.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Trace {
    /// Blender version that saved the scene.
    #[serde(default)]
    pub saved_with: String,
    /// Render engine.
    #[serde(default)]
    pub engine: String,
    /// Whether denoising is on for final renders.
    #[serde(default)]
    pub denoise: bool,
    /// Cycles' denoiser: OPENIMAGEDENOISE or OPTIX.
    #[serde(default)]
    pub denoiser: Option<String>,
    /// Why a tile of this scene depends on pixels beyond it (empty: tiles
    /// need no overscan); absent from a trace made before it was read.
    #[serde(default)]
    pub neighbours: Option<Vec<String>>,
    /// Every external file reference.
    #[serde(default)]
    pub files: Vec<TracedFile>,
    /// The frame range, output size and format.
    #[serde(default)]
    pub facts: Option<Facts>,
}

/// What a submit reads from the scene besides its files.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Facts {
    /// First frame.
    pub frame_start: i64,
    /// Last frame.
    pub frame_end: i64,
    /// Frame step.
    pub frame_step: i64,
    /// Output width, resolution percentage applied.
    pub width: u32,
    /// Output height.
    pub height: u32,
    /// Blender's output format name (`PNG`, `OPEN_EXR`, ...).
    pub file_format: String,
    /// Frames per second (fps / fps_base); 0 when not read.
    #[serde(default)]
    pub fps: f64,
}

/// What the CLI reads from a scene with Blender, in the form a job takes it.
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
    /// Frames per second (fps / fps_base); 0 when not read.
    pub fps: f64,
}

impl From<&Facts> for SceneFacts {
    fn from(f: &Facts) -> Self {
        Self {
            frames: match f.frame_step {
                0 | 1 => format!("{}-{}", f.frame_start, f.frame_end),
                s => format!("{}-{}x{s}", f.frame_start, f.frame_end),
            },
            width: f.width,
            height: f.height,
            file_format: f.file_format.clone(),
            fps: f.fps,
        }
    }
}

/// A trace remembered with what it depended on: the files it found (size
/// and modification time), the files it missed, and the folders it scanned
/// for patterns. It is reused only while all of that is unchanged.
#[derive(Debug, Serialize, Deserialize)]
struct CachedTrace {
    trace: Trace,
    checks: Vec<(PathBuf, Option<(u64, i128)>)>,
}

/// A file's size and modification time (0 size for a folder), if it exists.
pub fn stamp(p: &Path) -> Option<(u64, i128)> {
    let m = std::fs::metadata(p).ok()?;
    Some((if m.is_dir() { 0 } else { m.len() }, mtime_ns(&m)))
}

/// `$XDG_CACHE_HOME/tessera` (or `~/.cache/tessera`).
pub fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("tessera"))
}

/// [`trace`], remembered by the scene's content and path, the Blender used,
/// and every file and folder the trace looked at: submitting an unchanged
/// scene again starts no Blender.
pub async fn trace_cached(
    blender: &tessera_worker::runtime::Runtime,
    scene: &Path,
) -> Result<Trace> {
    let scene_abs =
        normalize(&std::path::absolute(scene).context("cannot resolve the scene's path")?);
    let (digest, _) = tessera_worker::transfer::hash_file(&scene_abs)
        .await
        .with_context(|| format!("cannot read {}", scene.display()))?;
    let which = blender.exe.clone();
    // The script is part of the key: a trace made by an older deps.py may
    // lack what this one reads.
    let key = blake3::hash(
        format!(
            "{digest}\0{}\0{}\0{:?}\0{}",
            scene_abs.display(),
            which.display(),
            stamp(&which),
            blake3::hash(DEPS_SCRIPT.as_bytes())
        )
        .as_bytes(),
    )
    .to_hex();
    let path = cache_dir().map(|d| d.join("traces").join(format!("{key}.json")));
    if let Some(cached) = path
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<CachedTrace>(&b).ok())
    {
        if cached.checks.iter().all(|(p, s)| stamp(p) == *s) {
            return Ok(cached.trace);
        }
    }
    let trace = trace(blender, scene).await?;
    if let Some(path) = path {
        let mut checks = Vec::new();
        for f in &trace.files {
            for m in &f.members {
                checks.push((PathBuf::from(m), stamp(Path::new(m))));
            }
            for m in &f.missing {
                checks.push((PathBuf::from(m), None));
            }
            if f.pattern.is_some() {
                let dir = Path::new(&f.abs);
                let dir = if f.pattern.as_deref() == Some("directory") {
                    dir
                } else {
                    dir.parent().unwrap_or(dir)
                };
                checks.push((dir.to_path_buf(), stamp(dir)));
            }
        }
        let cached = CachedTrace {
            trace: trace.clone(),
            checks,
        };
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(&cached)?)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            tracing::debug!("cannot remember the scene's trace: {e}");
        }
    }
    Ok(trace)
}

/// One external reference of a scene or of a library it links.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TracedFile {
    /// image, library, font, sound, movieclip, volume, cachefile, pointcache, ...
    pub kind: String,
    /// The datablock's name.
    #[serde(default)]
    pub name: String,
    /// The library holding the datablock, when it is linked.
    #[serde(default)]
    pub owner: Option<String>,
    /// The path as the scene stores it.
    #[serde(default)]
    pub written: String,
    /// The path resolved on this machine.
    pub abs: String,
    /// Whether the stored path is absolute.
    #[serde(default)]
    pub absolute_ref: bool,
    /// udim, sequence or directory, for references to several files.
    #[serde(default)]
    pub pattern: Option<String>,
    /// The existing files it covers.
    #[serde(default)]
    pub members: Vec<String>,
    /// The files it needs that do not exist.
    #[serde(default)]
    pub missing: Vec<String>,
}

impl TracedFile {
    /// How the scene refers to the file, for messages.
    pub fn describe(&self) -> String {
        let owner = self
            .owner
            .as_deref()
            .map(|o| format!(" in library {o}"))
            .unwrap_or_default();
        format!(
            "{} \"{}\"{owner} as `{}`",
            self.kind, self.name, self.written
        )
    }
}

/// Runs `deps.py` on `scene` with `blender` (factory settings, the scene's
/// own Python off, as on workers).
pub async fn trace(blender: &tessera_worker::runtime::Runtime, scene: &Path) -> Result<Trace> {
    let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let script = dir.path().join("deps.py");
    std::fs::write(&script, DEPS_SCRIPT).context("cannot write the tracing script")?;
    let bpy_run = dir.path().join("bpy_run.py");
    std::fs::write(&bpy_run, tessera_worker::runtime::BPY_RUN)
        .context("cannot write the tracing script")?;
    let out_json = dir.path().join("deps.json");
    let out = blender
        .command(Some(scene), &script, &bpy_run, false)
        .arg("--out")
        .arg(&out_json)
        .output()
        .await
        .with_context(|| {
            format!(
                "cannot run Blender ({}) to list the scene's files; install Blender (apt-get install blender) or pass --blender PATH",
                blender.describe()
            )
        })?;
    let text = match std::fs::read(&out_json) {
        Ok(t) if out.status.success() => t,
        _ => {
            let log = String::from_utf8_lossy(&out.stdout);
            let tail: Vec<&str> = log.lines().rev().take(6).collect();
            bail!(
                "Blender could not list the files of {}: {}",
                scene.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            );
        }
    };
    serde_json::from_slice(&text).context("Blender's file list is not valid JSON")
}

/// The files of a job laid out under its root.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// The folder the root mirrors.
    pub root: PathBuf,
    /// The scene's path under the root.
    pub scene: String,
    /// (path under the root, file on this machine), the scene first.
    pub files: Vec<(String, PathBuf)>,
    /// Absolute references and where they are under the root.
    pub mappings: Vec<(String, String)>,
    /// Missing files, each with how the scene refers to it.
    pub missing: Vec<String>,
    /// Folders on the studio's shared storage (`--shared`): files under them
    /// are not uploaded; workers reach them through their `--path-map`.
    pub shared: Vec<PathBuf>,
}

impl Layout {
    /// Whether `path` lies on shared storage.
    pub fn is_shared(&self, path: &Path) -> bool {
        self.shared.iter().any(|s| path.starts_with(s))
    }
}

/// Removes `.` and `..` components without touching the file system
/// (Blender resolves `//../x` the same way).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The deepest folder holding every one of `paths` (absolute, normalized).
fn common_folder<'a>(paths: impl Iterator<Item = &'a Path>) -> PathBuf {
    let mut common: Option<PathBuf> = None;
    for p in paths {
        let dir = p.parent().unwrap_or(Path::new("/"));
        common = Some(match common {
            None => dir.to_path_buf(),
            Some(c) => c
                .components()
                .zip(dir.components())
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect(),
        });
    }
    common.unwrap_or_else(|| PathBuf::from("/"))
}

/// `p` under `root` as a "/"-separated relative path.
fn under(root: &Path, p: &Path) -> Result<String> {
    let rel = p
        .strip_prefix(root)
        .with_context(|| format!("{} is not under {}", p.display(), root.display()))?;
    let parts: Vec<String> = rel
        .components()
        .map(|c| match c {
            Component::Normal(s) => s
                .to_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("{} is not a UTF-8 path; rename it", p.display())),
            other => Err(anyhow!("unexpected part {other:?} in {}", p.display())),
        })
        .collect::<Result<_>>()?;
    Ok(parts.join("/"))
}

/// Lays out `scene` and the files of `trace` under one root; files under
/// `shared` folders stay on the studio's shared storage.
pub fn layout(scene: &Path, trace: &Trace, shared: &[PathBuf]) -> Result<Layout> {
    let scene = normalize(&std::path::absolute(scene).context("cannot resolve the scene's path")?);
    let mut files: BTreeMap<PathBuf, ()> = BTreeMap::new();
    let mut missing = Vec::new();
    for f in &trace.files {
        for m in &f.members {
            files.insert(normalize(Path::new(m)), ());
        }
        for m in &f.missing {
            missing.push(format!("{m} ({})", f.describe()));
        }
    }
    files.remove(&scene);
    let root =
        common_folder(std::iter::once(scene.as_path()).chain(files.keys().map(PathBuf::as_path)));
    let mut out = Layout {
        scene: under(&root, &scene)?,
        files: vec![(under(&root, &scene)?, scene.clone())],
        missing,
        ..Default::default()
    };
    for p in files.keys() {
        out.files.push((under(&root, p)?, p.clone()));
    }
    for f in trace.files.iter().filter(|f| f.absolute_ref) {
        let abs = normalize(Path::new(&f.abs));
        if let Ok(to) = under(&root, &abs) {
            out.mappings.push((f.abs.clone(), to));
        }
    }
    out.mappings.sort();
    out.mappings.dedup();
    out.root = root;
    out.shared = shared
        .iter()
        .map(|s| Ok(normalize(&std::path::absolute(s)?)))
        .collect::<std::io::Result<_>>()
        .context("cannot resolve a --shared folder")?;
    if out.is_shared(&scene) {
        bail!(
            "the scene {} is itself under a --shared folder; the scene is always uploaded, so copy it elsewhere or drop that --shared",
            scene.display()
        );
    }
    Ok(out)
}

/// A file's modification time in nanoseconds since the epoch (0 when unknown).
pub fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    m.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128)
}

/// The Blender features a traced scene needs (see the coordinator's
/// `hardware::FEATURES`).
pub fn features(trace: &Trace) -> Vec<String> {
    let mut out = Vec::new();
    if trace.denoise {
        out.push(match trace.denoiser.as_deref() {
            Some("OPTIX") => "optix-denoise".to_string(),
            _ => "openimagedenoise".to_string(),
        });
    }
    if trace.engine.contains("EEVEE") {
        out.push("eevee".to_string());
    }
    out
}
