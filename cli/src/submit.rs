//! Submitting a scene: the scene, frames and tiles checked here, the scene
//! read with Blender (its frame range, size and files), its files uploaded
//! through [`crate::upload`], and its `JobSpec` built and submitted. Used by
//! `tessera submit` and `tessera render`; a bundle's job is
//! [`crate::bundle`]'s, which shares the checks.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use tessera_coordinator::blendfile;
use tessera_coordinator::model::frames::FrameSet;
use tessera_proto as pb;

use crate::client::Client;
use crate::{fileset, upload, JobArgs};

/// Checks that `path` is a Blender file, by its header.
pub fn check_scene(path: &Path) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)
        .with_context(|| format!("cannot open scene {}", path.display()))?;
    let mut head = Vec::with_capacity(12);
    (&mut file)
        .take(12)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot read scene {}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut tail = Vec::with_capacity(blendfile::TAIL);
    file.seek(SeekFrom::Start(size.saturating_sub(blendfile::TAIL as u64)))
        .and_then(|_| file.read_to_end(&mut tail))
        .with_context(|| format!("cannot read scene {}", path.display()))?;
    blendfile::check_end(&head, &tail).map_err(|e| anyhow!("{} {e}", path.display()))?;
    Ok(())
}

/// Validates the frame set here, for an early and clear error.
pub fn check_frames(frames: &str) -> Result<()> {
    FrameSet::check(frames)
        .map(drop)
        .map_err(|e| anyhow!("{e}"))
}

/// A checked submission: the frame set, the scene's facts when read, and
/// its files laid out under the job root.
pub struct Prepared {
    /// The scene file.
    pub scene: std::path::PathBuf,
    frames: String,
    facts: Option<fileset::SceneFacts>,
    layout: fileset::Layout,
    /// Blender features the scene needs.
    features: Vec<String>,
    /// The tiles' overscan margin in pixels.
    overscan: u32,
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
    check_scene(&scene)?;
    if let Some(n) = job.chunk.filter(|&n| n < 1) {
        bail!("--chunk {n} is not a frame count; use 1 or more frames per task, or leave it out and the farm sizes the tasks");
    }
    let grid: tessera_coordinator::model::tiles::Grid =
        job.tiles.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    // One Blender start reads the scene's files and facts; an unchanged
    // scene is not read again (see `fileset::trace_cached`). It is read by
    // a Blender of this machine that reads what saved it.
    let local = crate::runtimes::local(&job.reader()).await?;
    let reader = crate::runtimes::choose(&local, &scene, job.requirement()?)?;
    let trace = fileset::trace_cached(&reader.runtime, &scene).await?;
    let facts = trace.facts.as_ref().map(fileset::SceneFacts::from);
    let frames = match (&job.frames, &facts) {
        (Some(f), _) => f.clone(),
        (None, Some(facts)) => facts.frames.clone(),
        (None, None) => bail!("Blender did not report the scene's frame range; pass --frames"),
    };
    if grid.count() > 1 && facts.is_none() {
        bail!("Blender did not report the scene's resolution, which tiles need; submit without --tiles");
    }
    check_frames(&frames)?;
    if let Some(f) = facts.as_ref().filter(|_| grid.count() > 1) {
        tessera_coordinator::model::tiles::split(f.width, f.height, grid, u32::MAX)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let overscan = overscan(job.overscan, grid.count(), trace.neighbours.as_deref());
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
        overscan,
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

/// The tiles' overscan: `given`, or for a tiled job none when the scene
/// renders each pixel on its own (`neighbours` empty: a border render is
/// then bit-identical to the whole frame's pixels, see `blender/deps.py`),
/// else the farm's default. Says which, and why, for a tiled job.
fn overscan(given: Option<u32>, tiles: u64, neighbours: Option<&[String]>) -> u32 {
    use tessera_coordinator::farm::DEFAULT_OVERSCAN;
    let chosen = given.unwrap_or(match neighbours {
        Some([]) => 0,
        _ => DEFAULT_OVERSCAN,
    });
    if tiles > 1 && given.is_none() {
        match neighbours {
            Some([]) => eprintln!(
                "tiles: no overscan, as each pixel renders on its own (no adaptive sampling, denoising, path guiding or compositing)"
            ),
            Some(why) => eprintln!(
                "tiles: {chosen} px overscan for {}",
                why.join(", ")
            ),
            None => eprintln!("tiles: {chosen} px overscan"),
        }
    }
    chosen
}

/// Uploads and submits; returns the job id.
pub async fn submit_job(c: &mut Client, job: &JobArgs, prepared: Prepared) -> Result<u64> {
    let uploaded = upload::files(c, &prepared.layout).await?;
    uploaded.say(prepared.layout.files.len());
    let name = prepared
        .scene
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "scene.blend".into());
    let spec = pb::JobSpec {
        scene_digest: uploaded.scene,
        scene_name: name,
        frames: prepared.frames,
        // 0: the farm sizes the tasks.
        chunk: job
            .chunk
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        priority: job.priority,
        max_attempts: job.max_attempts.unwrap_or(0),
        tiles: job.tiles.clone(),
        overscan: Some(prepared.overscan),
        scene_info: prepared.facts.map(|f| pb::SceneInfo {
            width: f.width,
            height: f.height,
            file_format: f.file_format,
            fps: f.fps,
        }),
        device: job.device.clone(),
        min_vram_gb: job.min_vram,
        tags: job.tag.clone(),
        file_set_digest: uploaded.file_set.unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use super::overscan;

    #[test]
    fn a_given_overscan_wins_and_otherwise_the_scene_decides() {
        let none: &[String] = &[];
        let adaptive = ["adaptive sampling".to_string()];
        assert_eq!(overscan(Some(5), 4, Some(none)), 5);
        assert_eq!(overscan(Some(0), 4, Some(&adaptive)), 0);
        assert_eq!(overscan(None, 4, Some(none)), 0);
        assert_eq!(overscan(None, 4, Some(&adaptive)), 16);
        // A trace that did not say: the farm's default.
        assert_eq!(overscan(None, 4, None), 16);
    }
}
