//! Job bundles: a job written to a folder by the Blender add-on's "Export
//! job bundle", to be submitted later, from another machine, with
//! `tessera submit --bundle DIR`.
//!
//! ```text
//! DIR/manifest.json     {"format": "tessera-bundle", "version": 1,
//!                        "job": {JobSpec fields but the digests},
//!                        "file_set": {"scene", "files": [{path, digest, size, mode}],
//!                                     "mappings": [{from, to}], "missing": [..]}}
//! DIR/files/<path>      every file of the file set, under its path in the job root
//! ```
//!
//! The files are hashed again at submit and must match the manifest, so a
//! bundle damaged or edited after export is refused rather than rendered;
//! they are uploaded through [`crate::upload`], like a scene's.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use tessera_proto as pb;

use crate::client::Client;
use crate::fileset::Layout;
use crate::submit::check_frames;
use crate::{upload, JobArgs};

/// The manifest's `format` value.
const FORMAT: &str = "tessera-bundle";

/// `DIR/manifest.json`.
#[derive(Debug, Deserialize)]
struct Manifest {
    format: String,
    version: u32,
    job: Job,
    file_set: FileSet,
}

/// The job's settings, as `JobSpec` names them.
#[derive(Debug, Deserialize)]
struct Job {
    #[serde(default)]
    scene_name: String,
    frames: String,
    #[serde(default)]
    chunk: u32,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    max_attempts: u32,
    #[serde(default)]
    tiles: String,
    #[serde(default)]
    overscan: Option<u32>,
    #[serde(default)]
    scene_info: Option<SceneInfo>,
    #[serde(default)]
    device: String,
    #[serde(default)]
    min_vram_gb: f64,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    features: Vec<String>,
    /// The Blender versions that may render it (empty: what saved the scene).
    #[serde(default)]
    blender: String,
}

#[derive(Debug, Deserialize)]
struct SceneInfo {
    width: u32,
    height: u32,
    #[serde(default)]
    file_format: String,
    #[serde(default)]
    fps: f64,
}

#[derive(Debug, Deserialize)]
struct FileSet {
    scene: String,
    files: Vec<FileEntry>,
    #[serde(default)]
    mappings: Vec<Mapping>,
    #[serde(default)]
    missing: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct FileEntry {
    path: String,
    digest: String,
    size: u64,
    #[serde(default)]
    shared: String,
}

#[derive(Debug, Deserialize)]
struct Mapping {
    from: String,
    to: String,
}

/// Whether `p` is a path under a job root: relative, "/"-separated, without
/// empty, "." or ".." parts.
fn is_root_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Reads and checks `DIR/manifest.json`; returns it with the layout of its
/// files under `DIR/files`, the scene first.
fn read(dir: &Path) -> Result<(Manifest, Layout)> {
    let path = dir.join("manifest.json");
    let text = std::fs::read(&path).with_context(|| {
        format!(
            "cannot read {}; --bundle takes a folder written by the add-on's \"Export job bundle\"",
            path.display()
        )
    })?;
    let m: Manifest = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a job bundle manifest", path.display()))?;
    if m.format != FORMAT || m.version != 1 {
        bail!(
            "{} is a {:?} manifest version {}; this tessera reads {FORMAT:?} version 1: update tessera or export the bundle again",
            path.display(),
            m.format,
            m.version
        );
    }
    let fs = &m.file_set;
    let files_dir = dir.join("files");
    let mut layout = Layout {
        root: files_dir.clone(),
        scene: fs.scene.clone(),
        mappings: fs
            .mappings
            .iter()
            .map(|p| (p.from.clone(), p.to.clone()))
            .collect(),
        missing: fs.missing.clone(),
        ..Default::default()
    };
    let mut seen = std::collections::HashSet::new();
    for f in &fs.files {
        if !is_root_path(&f.path) || !seen.insert(f.path.as_str()) {
            bail!(
                "the bundle's manifest lists `{}`, which is not a path inside the job root (or is listed twice); export the bundle again",
                f.path
            );
        }
        if !f.shared.is_empty() {
            bail!(
                "the bundle lists {} on shared storage; bundles carry their files: export it again without shared folders",
                f.path
            );
        }
        let local: PathBuf = files_dir.join(&f.path);
        let meta = std::fs::symlink_metadata(&local).with_context(|| {
            format!(
                "the bundle lacks {} (listed in its manifest); copy the whole bundle folder",
                local.display()
            )
        })?;
        if !meta.is_file() {
            bail!(
                "{} in the bundle is not a regular file (a link or a folder); export the bundle again",
                local.display()
            );
        }
        if f.path == fs.scene {
            layout.files.insert(0, (f.path.clone(), local));
        } else {
            layout.files.push((f.path.clone(), local));
        }
    }
    if layout.files.first().map(|f| &f.0) != Some(&fs.scene) {
        bail!(
            "the bundle's scene `{}` is not among its files; export the bundle again",
            fs.scene
        );
    }
    Ok((m, layout))
}

/// Submits the bundle in `dir`; returns the job id. `args` may override the
/// frames, raise the priority, add tags and allow missing files; `preview`
/// asks for a preview video (`submit --preview`).
pub async fn submit(c: &mut Client, dir: &Path, args: &JobArgs, preview: bool) -> Result<u64> {
    let (m, layout) = read(dir)?;
    if !layout.missing.is_empty() && !args.allow_missing {
        bail!(
            "the bundle's scene refers to {} file(s) that were missing at export:\n  {}\nexport it again with the files in place, or submit with --allow-missing to render without them",
            layout.missing.len(),
            layout.missing.join("\n  ")
        );
    }
    let job = m.job;
    let frames = args.frames.clone().unwrap_or(job.frames);
    check_frames(&frames)?;
    // The check is the point: hash the bytes, never trust a size and mtime
    // that an edit can restore.
    let entries = upload::hash_all(&layout, &mut upload::HashCache::none(), false).await?;
    for (e, want) in entries.iter().zip(layout.files.iter().map(|(rel, _)| {
        m.file_set
            .files
            .iter()
            .find(|f| &f.path == rel)
            .expect("every layout file comes from the manifest")
    })) {
        if e.digest != want.digest || e.size != want.size {
            bail!(
                "{} in the bundle does not match its manifest (blake3 {}, {} bytes; the manifest says {}, {} bytes): the bundle was changed or damaged; export it again",
                e.path,
                e.digest,
                e.size,
                want.digest,
                want.size
            );
        }
    }
    let uploaded = upload::send(c, &layout, entries).await?;
    uploaded.say(layout.files.len());
    let mut tags = job.tags;
    tags.extend(args.tag.iter().cloned());
    let spec = pb::JobSpec {
        scene_digest: uploaded.scene,
        scene_name: if job.scene_name.is_empty() {
            layout
                .scene
                .rsplit('/')
                .next()
                .unwrap_or("scene.blend")
                .into()
        } else {
            job.scene_name
        },
        frames,
        chunk: job.chunk,
        priority: if args.priority != 0 {
            args.priority
        } else {
            job.priority
        },
        max_attempts: args.max_attempts.unwrap_or(job.max_attempts),
        tiles: job.tiles,
        overscan: job.overscan,
        scene_info: job.scene_info.map(|s| pb::SceneInfo {
            width: s.width,
            height: s.height,
            file_format: s.file_format,
            fps: s.fps,
        }),
        device: job.device,
        min_vram_gb: job.min_vram_gb,
        tags,
        file_set_digest: uploaded.file_set.unwrap_or_default(),
        features: {
            let mut features = if args.ignore_scene_features {
                Vec::new()
            } else {
                job.features
            };
            if args.scene_python {
                features.push(tessera_coordinator::model::hardware::SCENE_PYTHON.to_string());
            }
            features
        },
        blender: job.blender,
        after: args.after.clone(),
        max_cost: args.max_cost,
        capacity: args.capacity.clone(),
        preview,
        verify: args.verify,
    };
    Ok(c.farm
        .submit_job(spec)
        .await
        .map_err(|s| c.explain(s))?
        .into_inner()
        .job_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_paths_stay_inside_the_root() {
        assert!(is_root_path("shots/a.blend"));
        assert!(is_root_path("a.blend"));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a\\b",
            "a/",
        ] {
            assert!(!is_root_path(bad), "{bad}");
        }
    }

    fn bundle(dir: &Path, manifest: serde_json::Value, files: &[(&str, &[u8])]) {
        std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
        for (p, bytes) in files {
            let path = dir.join("files").join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
    }

    fn manifest(files: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"format": FORMAT, "version": 1,
            "job": {"frames": "1-2"},
            "file_set": {"scene": "shots/a.blend", "files": files}})
    }

    #[test]
    fn a_bundle_reads_with_its_scene_first() {
        let dir = tempfile::tempdir().unwrap();
        bundle(
            dir.path(),
            manifest(serde_json::json!([
                {"path": "tex/t.png", "digest": "d1", "size": 1},
                {"path": "shots/a.blend", "digest": "d0", "size": 1}])),
            &[("tex/t.png", b"t"), ("shots/a.blend", b"a")],
        );
        let (m, layout) = read(dir.path()).unwrap();
        assert_eq!(m.job.frames, "1-2");
        assert_eq!(layout.files[0].0, "shots/a.blend");
        assert_eq!(layout.files[1].1, dir.path().join("files/tex/t.png"));
    }

    #[test]
    fn a_bundle_naming_paths_outside_its_root_or_lacking_files_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        bundle(
            dir.path(),
            manifest(serde_json::json!([
                {"path": "shots/a.blend", "digest": "d0", "size": 1},
                {"path": "../secret", "digest": "d1", "size": 1}])),
            &[("shots/a.blend", b"a")],
        );
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a path inside the job root"), "{e}");
        bundle(
            dir.path(),
            manifest(serde_json::json!([
                {"path": "shots/a.blend", "digest": "d0", "size": 1},
                {"path": "tex/gone.png", "digest": "d1", "size": 1}])),
            &[],
        );
        let e = format!("{:#}", read(dir.path()).unwrap_err());
        assert!(e.contains("the bundle lacks"), "{e}");
        std::fs::write(dir.path().join("manifest.json"), "{}").unwrap();
        let e = format!("{:#}", read(dir.path()).unwrap_err());
        assert!(e.contains("not a job bundle manifest"), "{e}");
    }
}
