//! Preview videos: an H.264 MP4 of a done job's frames, in frame order, at
//! the scene's frame rate, made by the coordinator with ffmpeg and stored as
//! a content-addressed blob of the job.
//!
//! # Layout
//! - this file: what a job records about its preview ([`Preview`]), durably,
//!   and the frame rate read from the scene at submit.
//! - [`crate::imaging::video`]: frames to an MP4 with ffmpeg (decoding, tone-mapping and
//!   padding in [`crate::imaging::frame_image`] and here; ffmpeg run as a process
//!   with a time limit).
//! - [`crate::farm::preview_runner`]: the coordinator's preview maker: one preview at a time, on
//!   a thread of its own, never under the farm's lock.
//!
//! ```text
//!  not wanted ──submit --preview / MakePreview──▶ pending ──job done, ffmpeg──▶ ready
//!                                                   ▲                      └──▶ failed
//!                                                   └──────MakePreview again───────┘
//! ```
//! A preview that failed (no ffmpeg, a frame that cannot be read) never
//! fails its job: the job is done with all its frames, and its status says
//! why there is no video.

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::Error;

/// The frame rate of a preview whose job has none (submitted before the
/// frame rate was read, or by a client that does not read it).
pub const FALLBACK_FPS: f64 = 24.0;

/// The highest frame rate accepted from a scene (Blender allows up to 1000).
pub const MAX_FPS: f64 = 1000.0;

/// What a job records about its preview video.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Preview {
    /// The scene's frames per second (Blender's fps / fps_base), read at
    /// submit; None for jobs submitted without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fps: Option<f64>,
    /// Whether a preview video is wanted (`submit --preview`, `MakePreview`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wanted: bool,
    /// How the last attempt ended; None while one is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// How making a preview ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// The video is stored.
    Ready(Video),
    /// Why there is no video (the job itself is done all the same).
    Failed(String),
}

/// A stored preview video.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Video {
    /// The MP4 blob.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
    /// Frames in the video.
    pub frames: u32,
    /// Its width in pixels (even).
    pub width: u32,
    /// Its height in pixels (even).
    pub height: u32,
    /// Frames per second.
    pub fps: f64,
    /// What a viewer should know (the frame rate was assumed), or empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

impl Preview {
    /// A new job's preview record: `wanted` at submit, and the scene's
    /// frame rate as the submitter read it (0 or absent: unknown).
    pub fn at_submit(wanted: bool, fps: Option<f64>) -> Result<Self, Error> {
        Ok(Self {
            fps: scene_fps(fps)?,
            wanted,
            outcome: None,
        })
    }

    /// Whether a preview should be made now: wanted, not made or tried
    /// yet, and the job done (its frames are all there).
    pub fn is_due(&self, job_done: bool) -> bool {
        self.wanted && self.outcome.is_none() && job_done
    }

    /// The stored video's blob, when there is one (a reference of its job).
    pub fn digest(&self) -> Option<Digest> {
        match &self.outcome {
            Some(Outcome::Ready(v)) => Some(v.digest),
            _ => None,
        }
    }

    /// The frame rate to make the video at, and a note when it is assumed.
    pub fn fps_or_fallback(&self) -> (f64, String) {
        match self.fps {
            Some(fps) => (fps, String::new()),
            None => (
                FALLBACK_FPS,
                format!(
                    "the job has no frame rate (submitted before Tessera read it from the scene); the preview plays at {FALLBACK_FPS} fps"
                ),
            ),
        }
    }

    /// `pending`, `ready` or `failed`; None when no preview was asked for.
    pub fn state_name(&self) -> Option<&'static str> {
        match (&self.outcome, self.wanted) {
            (Some(Outcome::Ready(_)), _) => Some("ready"),
            (Some(Outcome::Failed(_)), _) => Some("failed"),
            (None, true) => Some("pending"),
            (None, false) => None,
        }
    }

    /// Asks for a preview (again): a failed one is tried again, a ready
    /// one is kept.
    pub fn request(&mut self) {
        self.wanted = true;
        if matches!(self.outcome, Some(Outcome::Failed(_))) {
            self.outcome = None;
        }
    }

    /// Forgets the outcome when the job's frames change (a retry reopens
    /// it): the preview is made again when it is done again, if wanted.
    pub fn reset(&mut self) {
        self.outcome = None;
    }
}

/// Checks the frame rate a submitter read from the scene: 0 (or none)
/// means unknown; anything else must be a frame rate Blender could have.
pub fn scene_fps(fps: Option<f64>) -> Result<Option<f64>, Error> {
    match fps {
        None => Ok(None),
        Some(0.0) => Ok(None),
        Some(f) if f.is_finite() && f > 0.0 && f <= MAX_FPS => Ok(Some(f)),
        Some(f) => Err(Error::invalid(format!(
            "the scene's frame rate {f} is not a frame rate; give a number of frames per second above 0 and at most {MAX_FPS} (Blender's fps / fps_base), or 0 when unknown"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn video() -> Video {
        Video {
            digest: Digest::of(b"mp4"),
            size: 3,
            frames: 12,
            width: 64,
            height: 48,
            fps: 12.0,
            note: String::new(),
        }
    }

    #[test]
    fn a_preview_is_due_only_when_wanted_untried_and_the_job_done() {
        let mut p = Preview::at_submit(true, Some(12.0)).unwrap();
        assert_eq!(p.state_name(), Some("pending"));
        assert!(!p.is_due(false));
        assert!(p.is_due(true));
        p.outcome = Some(Outcome::Failed("no ffmpeg".into()));
        assert!(!p.is_due(true));
        assert_eq!(p.state_name(), Some("failed"));
        p.request();
        assert!(p.is_due(true), "a failed preview is tried again");
        p.outcome = Some(Outcome::Ready(video()));
        p.request();
        assert_eq!(p.digest(), Some(Digest::of(b"mp4")), "a ready one is kept");
        assert!(!Preview::default().is_due(true));
        assert_eq!(Preview::default().state_name(), None);
    }

    #[test]
    fn frame_rates_are_checked_and_unknown_ones_fall_back_to_24_saying_so() {
        assert_eq!(scene_fps(Some(0.0)).unwrap(), None);
        assert_eq!(scene_fps(Some(29.97)).unwrap(), Some(29.97));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 5000.0] {
            let e = scene_fps(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("not a frame rate"), "{e}");
        }
        let (fps, note) = Preview::default().fps_or_fallback();
        assert_eq!(fps, 24.0);
        assert!(note.contains("24 fps"), "{note}");
        let (fps, note) = Preview::at_submit(false, Some(12.0))
            .unwrap()
            .fps_or_fallback();
        assert_eq!((fps, note.as_str()), (12.0, ""));
    }

    #[test]
    fn a_job_record_without_a_preview_reads_as_none_wanted() {
        let p: Preview = serde_json::from_str("{}").unwrap();
        assert_eq!(p, Preview::default());
        let stored = Preview {
            fps: Some(12.0),
            wanted: true,
            outcome: Some(Outcome::Ready(video())),
        };
        let again: Preview =
            serde_json::from_str(&serde_json::to_string(&stored).unwrap()).unwrap();
        assert_eq!(again, stored);
    }
}
