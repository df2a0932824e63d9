//! The Blenders this machine offers: a worker's `--blender` runtimes, the
//! local one `submit` reads a scene with, and `tessera blender install|list`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tessera_coordinator::model::runtime::{Version, VersionReq};
use tessera_worker::runtime::{self as rt, Offered, Runtime, Spec};

/// Where `bpy` runtimes are installed when no folder is given:
/// `$TESSERA_RUNTIMES`, else `~/.cache/tessera/runtimes`.
pub fn default_dir() -> PathBuf {
    std::env::var_os("TESSERA_RUNTIMES")
        .map(PathBuf::from)
        .or_else(|| crate::fileset::cache_dir().map(|d| d.join("runtimes")))
        .unwrap_or_else(|| PathBuf::from("tessera-runtimes"))
}

/// Where probe answers are remembered (see [`rt::probe`]).
fn remembered() -> Option<PathBuf> {
    crate::fileset::cache_dir().map(|d| d.join("runtime-caps.json"))
}

/// Resolves every `--blender` value (installing `bpy` lines under `dir`
/// when missing) and asks each runtime what it renders; newest first.
pub async fn offer(specs: &[String], dir: &Path) -> Result<Vec<Offered>> {
    let mut out: Vec<Offered> = Vec::new();
    for s in specs {
        let runtime = rt::resolve(&Spec::parse(s), dir)
            .await
            .with_context(|| format!("--blender {s}"))?;
        if out.iter().any(|o| o.runtime == runtime) {
            continue;
        }
        out.push(
            probed(runtime)
                .await
                .with_context(|| format!("--blender {s}"))?,
        );
    }
    if out.is_empty() {
        bail!("no Blender to render with; pass --blender PATH or --blender 4.5");
    }
    out.sort_by_key(|o| std::cmp::Reverse(Version::parse(&o.caps.version)));
    Ok(out)
}

/// `runtime` with what it said about itself (remembered per runtime).
async fn probed(runtime: Runtime) -> Result<Offered> {
    let scratch = std::env::temp_dir().join(format!("tessera-probe-{}", std::process::id()));
    let caps = rt::probe(&runtime, &scratch, remembered().as_deref()).await;
    let _ = std::fs::remove_dir_all(&scratch);
    let caps = caps.with_context(|| {
        format!(
            "cannot use {}; install Blender (apt-get install blender), or pass --blender PATH or --blender 4.5",
            runtime.describe()
        )
    })?;
    Ok(Offered { runtime, caps })
}

/// A Blender on this machine and its version (asked without the probe).
#[derive(Debug, Clone)]
pub struct Local {
    /// Its version.
    pub version: Version,
    /// How to run it.
    pub runtime: Runtime,
}

/// The Blenders on this machine: `blender` (a path, a bare name on `$PATH`,
/// or a venv) first, then every `bpy` runtime installed under
/// [`default_dir`], newest first. A `blender` that does not run is left out
/// when a `bpy` runtime is there.
pub async fn local(blender: &Path) -> Result<Vec<Local>> {
    let mut out = Vec::new();
    let given = rt::at_path(blender);
    let first_error = match version_of(&given).await {
        Ok(version) => {
            out.push(Local {
                version,
                runtime: given.clone(),
            });
            None
        }
        Err(e) => Some(e),
    };
    for (v, python) in rt::installed(&default_dir()) {
        let runtime = Runtime {
            kind: rt::Kind::Module,
            exe: python,
        };
        if runtime == given {
            continue;
        }
        if let [major, minor, patch] = v[..] {
            out.push(Local {
                version: Version {
                    major,
                    minor,
                    patch,
                },
                runtime,
            });
        }
    }
    match (out.is_empty(), first_error) {
        (true, Some(e)) => Err(e),
        (true, None) => bail!("no Blender found; install Blender (apt-get install blender)"),
        _ => Ok(out),
    }
}

/// The version of a runtime: `blender --version`, or the `bpy` package's;
/// remembered while the executable is unchanged, so that submitting again
/// starts no Blender.
async fn version_of(r: &Runtime) -> Result<Version> {
    let key = format!("{}\0{:?}", r.exe.display(), crate::fileset::stamp(&r.exe));
    let file = crate::fileset::cache_dir().map(|d| d.join("blender-versions.json"));
    let mut known: std::collections::BTreeMap<String, String> = file
        .as_ref()
        .and_then(|f| std::fs::read(f).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(v) = known.get(&key).and_then(|v| Version::parse(v)) {
        return Ok(v);
    }
    let line = match r.kind {
        rt::Kind::Binary => tessera_worker::blender::blender_version(&r.exe)
            .await
            .with_context(|| {
                format!(
                    "cannot run Blender `{}`; install Blender (apt-get install blender), or pass --blender PATH",
                    r.exe.display()
                )
            })?,
        rt::Kind::Module => {
            let out = tokio::process::Command::new(&r.exe)
                .args(["-I", "-c", "import importlib.metadata as m; print(m.version('bpy'))"])
                .output()
                .await
                .with_context(|| format!("cannot run {}", r.exe.display()))?;
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }
    };
    let version = Version::parse(&line)
        .with_context(|| format!("{} printed no Blender version", r.describe()))?;
    if let Some(f) = file {
        known.insert(key, version.to_string());
        let _ = std::fs::create_dir_all(f.parent().unwrap_or(Path::new(".")));
        let _ = serde_json::to_vec(&known).map(|b| std::fs::write(f, b));
    }
    Ok(version)
}

/// The Blender version (major, minor) that saved `scene`, from its header.
pub fn saved_by(scene: &Path) -> Option<(u16, u16)> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(scene)
        .ok()?
        .take(tessera_coordinator::blendfile::COMPRESSED_HEAD as u64)
        .read_to_end(&mut head)
        .ok()?;
    tessera_coordinator::blendfile::saved_version(&head).ok()
}

/// The local runtime to read (or render) `scene` with: one that satisfies
/// `req`, else one that reads what saved the scene (its line or newer within
/// its major); the first listed (the given `blender`) when it qualifies.
pub fn choose<'a>(local: &'a [Local], scene: &Path, req: Option<VersionReq>) -> Result<&'a Local> {
    let saved = saved_by(scene);
    let want = req.or(saved.map(|(a, b)| VersionReq::saved_by(a, b)));
    let Some(want) = want else {
        return local.first().context("no Blender found");
    };
    let fits = |o: &&Local| want.matches(o.version);
    if let Some(o) = local.iter().find(fits) {
        return Ok(o);
    }
    let have: Vec<String> = local.iter().map(|o| o.version.to_string()).collect();
    let line = match (req, saved) {
        (Some(r), _) => format!("Blender {r}"),
        (None, Some((a, b))) => format!("Blender {a}.{b} (which saved it) or newer {a}.x"),
        (None, None) => "another Blender".into(),
    };
    let install = match want {
        VersionReq::Line(a, b) | VersionReq::AtLeast(a, b) | VersionReq::SameMajor(a, b) => {
            format!("{a}.{b}")
        }
    };
    bail!(
        "{} needs {line} to be read, and this machine has {}; install it with `tessera blender install {install}`, or pass --blender with a Blender that reads it",
        scene.display(),
        have.join(", ")
    )
}

/// `tessera blender install LINE`: installs a `bpy` runtime and says where.
pub async fn install(version: &str, dir: Option<PathBuf>) -> Result<()> {
    let dir = dir.unwrap_or_else(default_dir);
    let Spec::Bpy(v) = Spec::parse(version) else {
        bail!("`{version}` is not a Blender line; give e.g. 4.5 or 4.5.15");
    };
    let runtime = rt::resolve(&Spec::Bpy(v), &dir).await?;
    let offered = probed(runtime).await?;
    print_one(&offered);
    Ok(())
}

/// `tessera blender list`: the Blenders this machine offers, with what each
/// renders.
pub async fn list(blender: &Path) -> Result<()> {
    for l in local(blender).await? {
        print_one(&probed(l.runtime).await?);
    }
    Ok(())
}

/// Every local Blender with what it renders (for `tessera render`'s worker).
pub async fn offer_local(local: &[Local]) -> Result<Vec<Offered>> {
    let mut out = Vec::new();
    for l in local {
        out.push(probed(l.runtime.clone()).await?);
    }
    Ok(out)
}

fn print_one(o: &Offered) {
    let mut what = o.caps.features.clone();
    what.extend(o.caps.devices.iter().cloned());
    println!(
        "Blender {:<10} {:<8} {}  [{}]",
        o.caps.version,
        o.runtime.kind.name(),
        o.runtime.exe.display(),
        what.join(", ")
    );
}

/// A `--blender` value of `submit`/`render`: a version requirement for the
/// job (`4.5`, `>=4.2`, `^4.2`), or else the path of a Blender to read the
/// scene with.
pub fn requirement(spec: Option<&str>) -> Result<Option<VersionReq>> {
    match spec {
        Some(s) if s.starts_with(|c: char| c.is_ascii_digit() || "<>=^".contains(c)) => {
            Ok(Some(VersionReq::parse(s)?))
        }
        _ => Ok(None),
    }
}
