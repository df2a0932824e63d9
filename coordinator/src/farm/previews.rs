//! Preview videos on the farm's side: which jobs need one (the preview
//! queue, `stitching::Finishing`, derived from the job records like the
//! stitch queue, so a crash loses nothing), what making one needs, and
//! recording how it ended. The video itself is made by
//! [`crate::farm::preview_runner`], outside the farm's lock.

use super::*;
use crate::model::preview::Outcome;

/// What making a job's preview needs, copied out of the farm.
#[derive(Debug, Clone)]
pub struct PreviewWork {
    /// The job's frames (its passes left out), in frame order.
    pub frames: Vec<FrameOutput>,
    /// Frames per second.
    pub fps: f64,
    /// Said with the video when the frame rate was assumed.
    pub note: String,
}

impl Farm {
    /// Jobs whose preview is due (wanted, done, not made yet), oldest first.
    pub fn previews_due(&self) -> Vec<JobId> {
        self.lock().finishing.previews().collect()
    }

    /// The frames and frame rate of job `id`'s preview, or None when it is
    /// not due (any more).
    pub fn preview_work(&self, id: JobId) -> Result<Option<PreviewWork>, Error> {
        let st = self.lock();
        let Some(job) = st.jobs.get(&id) else {
            return Ok(None);
        };
        if !job.preview.is_due(job.state == JobState::Done) {
            return Ok(None);
        }
        let page = Page {
            output_limit: u32::MAX,
            ..Page::SUMMARY
        };
        let mut frames: Vec<FrameOutput> = self
            .view(&st, job, page)
            .outputs
            .into_iter()
            .filter(|o| o.pass.is_empty())
            .collect();
        drop(st);
        frames.sort_by_key(|o| o.frame);
        frames.dedup_by_key(|o| o.frame);
        let (fps, note) = self.lock().jobs.get(&id).map_or_else(
            || crate::model::preview::Preview::default().fps_or_fallback(),
            |j| j.preview.fps_or_fallback(),
        );
        Ok(Some(PreviewWork { frames, fps, note }))
    }

    /// Records how making job `id`'s preview ended, durably. A video for a
    /// job that is gone or no longer wants it is left to the collector.
    pub fn record_preview(&self, id: JobId, outcome: Outcome) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        let job = st
            .jobs
            .get(&id)
            .filter(|j| j.preview.is_due(j.state == JobState::Done))
            .cloned();
        let Some(mut job) = job else {
            if let Outcome::Ready(v) = &outcome {
                st.blobs.note_unreferenced(v.digest, now);
            }
            return Ok(());
        };
        match &outcome {
            Outcome::Ready(v) => {
                tracing::info!(job = %id, frames = v.frames, bytes = v.size, "preview ready")
            }
            Outcome::Failed(why) => tracing::warn!(job = %id, "preview failed: {why}"),
        }
        job.preview.outcome = Some(outcome);
        let ticket = self.save(&mut st, job, Vec::new(), Vec::new());
        drop(st);
        ticket.wait()
    }

    /// Asks for job `id`'s preview video: made as soon as the job is done
    /// (now, when it is); a failed one is tried again. Answers the job.
    pub fn request_preview(&self, id: JobId) -> Result<JobSnapshot, Error> {
        if self.lock().archived.contains_key(&id) {
            return Err(Error::Conflict(format!(
                "job {id} is archived; previews are made only for live jobs (`tessera fetch {id}` still gets its frames)"
            )));
        }
        let snap = self.change(id, |job, _| match job.state {
            JobState::Failed | JobState::Canceled => Err(Error::Conflict(format!(
                "job {id} is {}; a preview is made from a done job's frames: `tessera retry {id}` first",
                job.state.name()
            ))),
            _ => {
                job.preview.request();
                Ok(())
            }
        })?;
        tracing::info!(job = %id, "preview asked for");
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::*;
    use crate::model::preview::Video;

    /// Renders every task of job `id` with one worker.
    fn render_all(f: &Fixture, id: JobId) {
        let w = worker(&f.farm, "a");
        while let Some(a) = f.farm.try_lease(&w, &HashSet::new()).unwrap() {
            assert_eq!(a.lease.job, id);
            let outs = a.frames.iter().map(|&fr| output(f, fr)).collect();
            f.farm.complete(a.lease, outs).unwrap();
        }
        assert_eq!(f.farm.job(id).unwrap().job.state, JobState::Done);
    }

    fn video(d: Digest) -> Outcome {
        Outcome::Ready(Video {
            digest: d,
            size: 3,
            frames: 2,
            width: 64,
            height: 48,
            fps: 24.0,
            note: String::new(),
        })
    }

    #[test]
    fn a_wanted_preview_is_due_once_the_job_is_done_and_keeps_its_blob_until_deleted() {
        let f = fixture();
        let mut s = sub(f.scene, "1-2", 1);
        s.preview = true;
        let id = f.farm.submit(s).unwrap();
        assert!(f.farm.previews_due().is_empty(), "not done yet");
        render_all(&f, id);
        assert_eq!(f.farm.previews_due(), vec![id]);
        let work = f.farm.preview_work(id).unwrap().unwrap();
        assert_eq!(
            work.frames.iter().map(|o| o.frame).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(work.fps, 24.0);
        assert!(work.note.contains("24 fps"), "{}", work.note);

        let mp4 = b"an mp4".to_vec();
        let d = Digest::of(&mp4);
        f.farm.blobs().put(d, &mp4).unwrap();
        f.farm.record_preview(id, video(d)).unwrap();
        assert!(f.farm.previews_due().is_empty());
        let job = f.farm.job(id).unwrap().job;
        assert_eq!(job.preview.digest(), Some(d));
        assert_eq!(f.farm.lock().blobs.count(&d), 1, "the job references it");

        // It survives a restart, and goes with the job.
        let farm = f.reopen();
        assert_eq!(farm.job(id).unwrap().job.preview.digest(), Some(d));
        assert_eq!(farm.lock().blobs.count(&d), 1);
        assert!(farm.previews_due().is_empty());
        farm.delete(id).unwrap();
        assert_eq!(farm.lock().blobs.count(&d), 0);
        assert!(
            farm.lock().blobs.is_garbage(&d),
            "collected after the grace"
        );
    }

    #[test]
    fn a_failed_preview_leaves_the_job_done_and_is_tried_again_on_request() {
        let f = fixture();
        let id = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
        render_all(&f, id);
        assert!(f.farm.previews_due().is_empty(), "not asked for");
        f.farm.request_preview(id).unwrap();
        assert_eq!(f.farm.previews_due(), vec![id]);
        f.farm
            .record_preview(id, Outcome::Failed("ffmpeg could not be started".into()))
            .unwrap();
        let job = f.farm.job(id).unwrap().job;
        assert_eq!(job.state, JobState::Done);
        assert_eq!(job.preview.state_name(), Some("failed"));
        assert!(f.farm.previews_due().is_empty());
        f.farm.request_preview(id).unwrap();
        assert_eq!(f.farm.previews_due(), vec![id], "asked again: tried again");
    }

    #[test]
    fn a_preview_of_a_failed_or_canceled_job_is_refused_and_a_late_video_is_collected() {
        let f = fixture();
        let id = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
        f.farm.cancel(id).unwrap();
        let e = f.farm.request_preview(id).unwrap_err().to_string();
        assert!(e.contains("canceled") && e.contains("tessera retry"), "{e}");
        let d = Digest::of(b"late");
        f.farm.record_preview(id, video(d)).unwrap();
        assert!(f.farm.lock().blobs.is_garbage(&d));
        assert_eq!(f.farm.job(id).unwrap().job.preview.outcome, None);
    }
}
