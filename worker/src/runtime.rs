//! Blender runtimes: the Blenders a worker renders with.
//!
//! A runtime is a `blender` binary (Debian's, or an official tarball a
//! studio unpacks) or the official `bpy` module from PyPI in a venv. Both run
//! the same Blender-side scripts with the same isolation ([`Runtime::command`]):
//! the binary as `blender -b --factory-startup --disable-autoexec SCENE
//! --python SCRIPT -- ARGS`, the module as `python -I bpy_run.py --script
//! SCRIPT --scene SCENE -- ARGS`, where `blender/bpy_run.py` does what those
//! flags do. One session protocol serves both.
//!
//! `--blender 4.5` names a line of the `bpy` module: the newest installed
//! `bpy-4.5.*` under the runtimes folder is used, or the newest 4.5 release
//! is installed there once ([`install`]), with the Python version its wheels
//! are built for. What a runtime can render is asked of it ([`probe`]),
//! EEVEE included, by rendering a tiny frame; the answer is remembered per
//! runtime, as that render costs seconds.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::Command;

use crate::capabilities::feature;
use crate::error::Error;

/// Runs a Blender-side script in the `bpy` module as the binary would.
pub const BPY_RUN: &str = include_str!("../../blender/bpy_run.py");
/// Asks a Blender what it can render.
const PROBE: &str = include_str!("../../blender/probe.py");

/// How long the capability probe (EEVEE's first frame compiles shaders) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(300);

/// How a runtime is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A `blender` executable.
    Binary,
    /// The `bpy` module, run by the Python of its venv.
    Module,
}

impl Kind {
    /// `blender` or `bpy`, as the protocol names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Binary => "blender",
            Self::Module => "bpy",
        }
    }
}

/// A Blender the worker can start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// Binary or module.
    pub kind: Kind,
    /// Blender, or the venv's Python.
    pub exe: PathBuf,
}

/// What a runtime is and can render, as it told the probe.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caps {
    /// `4.5.15`.
    pub version: String,
    /// Feature names (see [`feature`]).
    pub features: Vec<String>,
    /// GPU devices Cycles found: `OPTIX NVIDIA H200`.
    pub devices: Vec<String>,
}

/// A runtime with what it can do: what the worker offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    /// How to run it.
    pub runtime: Runtime,
    /// What it said about itself.
    pub caps: Caps,
}

impl Runtime {
    /// A command that runs `script` in this Blender, in background mode,
    /// with the isolation flags, on `scene` when given; the script's own
    /// arguments are appended by the caller (they follow `--`). Stored
    /// Python in the scene runs only with `scene_python`.
    pub fn command(
        &self,
        scene: Option<&Path>,
        script: &Path,
        bpy_run: &Path,
        scene_python: bool,
    ) -> Command {
        let mut cmd = Command::new(&self.exe);
        match self.kind {
            Kind::Binary => {
                cmd.args(crate::isolation::blender_flags(scene_python))
                    .args(scene)
                    .args(["--python-exit-code", "3", "--python"])
                    .arg(script);
            }
            Kind::Module => {
                cmd.arg("-I").arg(bpy_run).arg("--script").arg(script);
                if let Some(scene) = scene {
                    cmd.arg("--scene").arg(scene);
                }
                if scene_python {
                    cmd.arg("--scene-python");
                }
            }
        }
        cmd.arg("--");
        cmd
    }

    /// `bpy in /cache/runtimes/bpy-4.5.15` or `blender /usr/bin/blender`.
    pub fn describe(&self) -> String {
        match self.kind {
            Kind::Binary => format!("blender {}", self.exe.display()),
            Kind::Module => format!(
                "bpy in {}",
                self.exe
                    .parent()
                    .and_then(Path::parent)
                    .unwrap_or(&self.exe)
                    .display()
            ),
        }
    }
}

/// What `--blender` names: a Blender executable or venv, or a line of the
/// `bpy` module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// A path (or a bare name found on `$PATH`): a `blender` binary, a
    /// venv's `python`, or a venv folder.
    Path(PathBuf),
    /// `4.5` (the newest 4.5.x) or `4.5.15`: the `bpy` module from PyPI.
    Bpy(Vec<u16>),
}

impl Spec {
    /// Reads a `--blender` value: digits and dots are a version, anything
    /// else a path.
    pub fn parse(s: &str) -> Self {
        let parts: Option<Vec<u16>> = s.split('.').map(|p| p.parse().ok()).collect();
        match parts {
            Some(v) if (2..=3).contains(&v.len()) => Self::Bpy(v),
            _ => Self::Path(PathBuf::from(s)),
        }
    }
}

/// The version of a folder named `bpy-4.5.15`.
fn folder_version(name: &str) -> Option<Vec<u16>> {
    name.strip_prefix("bpy-")?
        .split('.')
        .map(|p| p.parse().ok())
        .collect()
}

/// The `bpy` runtimes installed under `dir`, newest first: (version, python).
pub fn installed(dir: &Path) -> Vec<(Vec<u16>, PathBuf)> {
    let mut found: Vec<(Vec<u16>, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = folder_version(e.file_name().to_str()?)?;
            let python = e.path().join("bin/python");
            python.is_file().then_some((v, python))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found
}

/// The Python version the `bpy` wheels of a Blender line are built for.
pub fn python_for(version: &[u16]) -> &'static str {
    match version {
        [3, ..] => "3.10",
        [4, ..] | [5, 0, ..] => "3.11",
        _ => "3.13",
    }
}

/// The runtime `spec` names, installing a `bpy` line under `dir` when it is
/// not there yet.
pub async fn resolve(spec: &Spec, dir: &Path) -> Result<Runtime, Error> {
    match spec {
        Spec::Path(p) => Ok(at_path(p)),
        Spec::Bpy(v) => {
            let wanted = |have: &[u16]| have.starts_with(v);
            if let Some((_, python)) = installed(dir).into_iter().find(|(h, _)| wanted(h)) {
                return Ok(Runtime {
                    kind: Kind::Module,
                    exe: python,
                });
            }
            install(v, dir).await
        }
    }
}

/// A runtime at a path: a venv (its folder or its `python`) runs the
/// module, anything else is a Blender binary (a bare name is looked up on
/// `$PATH`).
pub fn at_path(p: &Path) -> Runtime {
    if p.is_dir() && p.join("bin/python").is_file() {
        return Runtime {
            kind: Kind::Module,
            exe: p.join("bin/python"),
        };
    }
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with("python") {
        return Runtime {
            kind: Kind::Module,
            exe: p.to_path_buf(),
        };
    }
    Runtime {
        kind: Kind::Binary,
        exe: which(p),
    }
}

/// `p` found on `$PATH` when it is a bare name.
pub fn which(p: &Path) -> PathBuf {
    if p.components().count() > 1 {
        return p.to_path_buf();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|d| d.join(p))
        .find(|c| c.is_file())
        .unwrap_or_else(|| p.to_path_buf())
}

/// Installs the newest `bpy` release of line `version` (or that exact
/// release) from PyPI into a venv `dir/bpy-X.Y.Z`, made with the Python its
/// wheels need. pip's own progress bar shows the download. A half-done
/// install never takes the final name.
pub async fn install(version: &[u16], dir: &Path) -> Result<Runtime, Error> {
    let line = version
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(".");
    let pin = if version.len() >= 3 {
        format!("bpy=={line}")
    } else {
        format!("bpy=={line}.*")
    };
    let py = python_for(version);
    let fail = |reason: String| Error::Install {
        line: line.clone(),
        reason,
    };
    let python = find_python(py).await.ok_or_else(|| {
        fail(format!(
            "Blender {line} as a Python module needs Python {py}, which its wheels are built for, and `python{py}` is not on PATH; install it (apt-get install python{py} python{py}-venv, or pyenv install {py}) and try again"
        ))
    })?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    let tmp = dir.join(format!(".installing-bpy-{line}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let started = Instant::now();
    eprintln!(
        "installing Blender {line} (the `bpy` module from PyPI, about 400 MB) into {} with {} ...",
        dir.display(),
        python.display()
    );
    let venv = Command::new(&python)
        .args(["-m", "venv"])
        .arg(&tmp)
        .output()
        .await
        .map_err(|e| fail(format!("cannot run {}: {e}", python.display())))?;
    if !venv.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(fail(format!(
            "`{} -m venv` failed ({}); install the venv module (apt-get install python{py}-venv)",
            python.display(),
            last_line(&venv.stderr)
        )));
    }
    let venv_python = tmp.join("bin/python");
    // pip's progress bar goes to the worker's terminal: the download is long.
    let pip = Command::new(&venv_python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "on",
        ])
        .arg(&pin)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .await
        .map_err(|e| fail(format!("cannot run pip: {e}")))?;
    if !pip.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(fail(format!(
            "pip could not install {pin} ({pip}; its words are above); check that this machine reaches PyPI, and that {pin} exists for Python {py}"
        )));
    }
    let out = Command::new(&venv_python)
        .args([
            "-I",
            "-c",
            "import importlib.metadata as m; print(m.version('bpy'))",
        ])
        .output()
        .await
        .map_err(|e| fail(format!("cannot run {}: {e}", venv_python.display())))?;
    let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if folder_version(&format!("bpy-{got}")).is_none() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(fail(format!(
            "pip installed a `bpy` whose version reads `{got}`"
        )));
    }
    let dest = dir.join(format!("bpy-{got}"));
    if std::fs::rename(&tmp, &dest).is_err() {
        // Another worker installed the same release meanwhile: use it.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    let python = dest.join("bin/python");
    if !python.is_file() {
        return Err(fail(format!(
            "the venv {} has no bin/python after the install",
            dest.display()
        )));
    }
    eprintln!(
        "installed Blender {got} (bpy) in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        dest.display()
    );
    Ok(Runtime {
        kind: Kind::Module,
        exe: python,
    })
}

/// `pythonX.Y` on PATH, or `python3` when it is that version.
async fn find_python(version: &str) -> Option<PathBuf> {
    for name in [format!("python{version}"), "python3".to_string()] {
        let exe = which(Path::new(&name));
        let Ok(out) = Command::new(&exe)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            .output()
            .await
        else {
            continue;
        };
        if String::from_utf8_lossy(&out.stdout).trim() == version {
            return Some(exe);
        }
    }
    None
}

fn last_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .trim()
        .to_string()
}

/// Asks `rt` what it is and can render, in the environment its sessions get
/// (no display: EEVEE must work headless). The answer is remembered in
/// `remember` (a JSON file), keyed by the runtime's executable and its
/// modification time, so that the EEVEE frame is rendered once per runtime.
pub async fn probe(rt: &Runtime, dir: &Path, remember: Option<&Path>) -> Result<Caps, Error> {
    let key = identity(rt);
    let mut known: serde_json::Map<String, Value> = remember
        .and_then(|f| std::fs::read(f).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(caps) = known.get(&key).and_then(caps_from_json) {
        return Ok(caps);
    }
    let fail = |reason: String| Error::Blender {
        path: rt.exe.display().to_string(),
        reason,
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    let script = dir.join("tessera_probe.py");
    let bpy_run = dir.join("bpy_run.py");
    for (path, text) in [(&script, PROBE), (&bpy_run, BPY_RUN)] {
        std::fs::write(path, text)
            .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))?;
    }
    let frame = dir.join("eevee-probe.png");
    let _ = std::fs::remove_file(&frame);
    tracing::info!(
        runtime = %rt.describe(),
        "asking Blender what it can render (an EEVEE frame too: once per runtime, up to a minute)"
    );
    let mut cmd = rt.command(None, &script, &bpy_run, false);
    cmd.arg("--eevee")
        .arg(&frame)
        .env_clear()
        .envs(crate::isolation::blender_env(std::env::vars_os(), dir))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(PROBE_TIMEOUT, cmd.output())
        .await
        .map_err(|_| {
            fail(format!(
                "it did not answer the probe within {PROBE_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| fail(format!("cannot start it: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let caps = parse(&text).ok_or_else(|| {
        fail(format!(
            "it did not report its build (exit {}): {}",
            out.status,
            text.lines().rev().take(3).collect::<Vec<_>>().join(" / ")
        ))
    })?;
    if !caps.features.iter().any(|f| f == feature::EEVEE) {
        tracing::info!(runtime = %rt.describe(), "EEVEE does not render here (no display, and no EGL fallback)");
    }
    if let Some(file) = remember {
        known.insert(key, caps_to_json(&caps));
        let _ = std::fs::create_dir_all(file.parent().unwrap_or(Path::new(".")));
        let _ = std::fs::write(file, Value::Object(known).to_string());
    }
    Ok(caps)
}

/// What the probe is remembered by: the kind, the executable, and its size
/// and modification time (a new Blender at the same path is asked again).
fn identity(rt: &Runtime) -> String {
    // A venv's python is a link to the system's; the module's own library
    // changes when bpy does.
    let marker = match rt.kind {
        Kind::Binary => rt.exe.clone(),
        Kind::Module => rt
            .exe
            .parent()
            .and_then(Path::parent)
            .map_or_else(|| rt.exe.clone(), |venv| venv.join("pyvenv.cfg")),
    };
    let stamp = std::fs::metadata(&marker)
        .ok()
        .map(|m| (m.len(), m.modified().ok()));
    format!("{}\0{}\0{stamp:?}", rt.kind.name(), rt.exe.display())
}

fn caps_to_json(c: &Caps) -> Value {
    serde_json::json!({"version": c.version, "features": c.features, "devices": c.devices})
}

fn caps_from_json(v: &Value) -> Option<Caps> {
    let list = |k: &str| -> Option<Vec<String>> {
        v[k].as_array()?
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    Some(Caps {
        version: v["version"].as_str()?.to_string(),
        features: list("features")?,
        devices: list("devices")?,
    })
}

/// Reads the probe's `TESSERA_CAPS {json}` and `TESSERA_EEVEE ok` lines.
fn parse(stdout: &str) -> Option<Caps> {
    let caps: Value = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TESSERA_CAPS "))
        .and_then(|j| serde_json::from_str(j).ok())?;
    let mut features = Vec::new();
    if caps["openimagedenoise"].as_bool() == Some(true) {
        features.push(feature::OIDN.to_string());
    }
    if caps["osl"].as_bool() == Some(true) {
        features.push(feature::OSL.to_string());
    }
    if stdout.lines().any(|l| l.trim() == "TESSERA_EEVEE ok") {
        features.push(feature::EEVEE.to_string());
    }
    Some(Caps {
        version: caps["version"].as_str()?.to_string(),
        features,
        devices: caps["devices"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_versions_or_paths() {
        assert_eq!(Spec::parse("4.5"), Spec::Bpy(vec![4, 5]));
        assert_eq!(Spec::parse("4.5.15"), Spec::Bpy(vec![4, 5, 15]));
        assert_eq!(Spec::parse("blender"), Spec::Path("blender".into()));
        assert_eq!(
            Spec::parse("/opt/blender-4.2/blender"),
            Spec::Path("/opt/blender-4.2/blender".into())
        );
        assert_eq!(Spec::parse("4"), Spec::Path("4".into()));
        assert_eq!(python_for(&[4, 5]), "3.11");
        assert_eq!(python_for(&[5, 0]), "3.11");
        assert_eq!(python_for(&[4, 2, 9]), "3.11");
    }

    #[test]
    fn installed_runtimes_are_found_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "bpy-4.2.3",
            "bpy-4.5.15",
            "bpy-4.5.2",
            ".installing-bpy-5.0-1",
            "bpy-x",
        ] {
            std::fs::create_dir_all(dir.path().join(name).join("bin")).unwrap();
            std::fs::write(dir.path().join(name).join("bin/python"), b"").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("bpy-5.0.0")).unwrap(); // no python: half-made
        let found: Vec<Vec<u16>> = installed(dir.path()).into_iter().map(|(v, _)| v).collect();
        assert_eq!(found, vec![vec![4, 5, 15], vec![4, 5, 2], vec![4, 2, 3]]);
        let rt = at_path(&dir.path().join("bpy-4.2.3"));
        assert_eq!(rt.kind, Kind::Module);
        assert_eq!(rt.exe, dir.path().join("bpy-4.2.3/bin/python"));
        assert_eq!(at_path(Path::new("/usr/bin/blender")).kind, Kind::Binary);
    }

    #[test]
    fn the_probe_lines_are_read() {
        let out = "Blender 4.5.15\nTESSERA_CAPS {\"version\": \"4.5.15\", \"openimagedenoise\": true, \"osl\": false, \"devices\": [\"OPTIX NVIDIA H200\"]}\nSaved: x\nTESSERA_EEVEE ok\n";
        let caps = parse(out).unwrap();
        assert_eq!(caps.version, "4.5.15");
        assert_eq!(caps.features, vec!["openimagedenoise", "eevee"]);
        assert_eq!(caps.devices, vec!["OPTIX NVIDIA H200"]);
        assert_eq!(caps_from_json(&caps_to_json(&caps)), Some(caps));
        let no_eevee =
            parse("TESSERA_CAPS {\"version\": \"3.4.1\", \"openimagedenoise\": false, \"osl\": false, \"devices\": []}").unwrap();
        assert!(no_eevee.features.is_empty());
        assert!(parse("Error: nothing").is_none());
    }

    #[test]
    fn both_kinds_start_the_same_script_with_the_same_isolation() {
        let bin = Runtime {
            kind: Kind::Binary,
            exe: "/usr/bin/blender".into(),
        };
        let args = |c: &Command| -> Vec<String> {
            c.as_std()
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let cmd = bin.command(
            Some(Path::new("/s.blend")),
            Path::new("/x.py"),
            Path::new("/r.py"),
            false,
        );
        assert_eq!(
            args(&cmd),
            [
                "-b",
                "--factory-startup",
                "--disable-autoexec",
                "/s.blend",
                "--python-exit-code",
                "3",
                "--python",
                "/x.py",
                "--"
            ]
        );
        let module = Runtime {
            kind: Kind::Module,
            exe: "/v/bin/python".into(),
        };
        let cmd = module.command(
            Some(Path::new("/s.blend")),
            Path::new("/x.py"),
            Path::new("/r.py"),
            false,
        );
        assert_eq!(
            args(&cmd),
            ["-I", "/r.py", "--script", "/x.py", "--scene", "/s.blend", "--"]
        );
        let cmd = module.command(None, Path::new("/x.py"), Path::new("/r.py"), true);
        assert_eq!(
            args(&cmd),
            ["-I", "/r.py", "--script", "/x.py", "--scene-python", "--"]
        );
    }
}
