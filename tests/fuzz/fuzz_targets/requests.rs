//! Every request message of the protocol, decoded from arbitrary bytes and run
//! through the conversions the coordinator's gRPC handlers apply to it.
//!
//! Input layout: byte 0 picks the message type (modulo the number of types),
//! the rest is its protobuf encoding.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tessera_coordinator::adapters::convert::{digest, job_id, slot_cap};
use tessera_coordinator::digest::Digest;
use tessera_coordinator::farm::{Registration, Submission};
use tessera_coordinator::model::frames::FrameSet;
use tessera_coordinator::model::hardware::{Gpu, Requirements};
use tessera_coordinator::imaging::limits::PixelLimit;
use tessera_coordinator::model::task::{FrameOutput, LeaseId};
use tessera_coordinator::model::tiles::{self, Grid};
use tessera_proto as pb;

/// The coordinator's default limits (`farm::Config`).
const MAX_FRAMES: u64 = 100_000;
const MAX_TILES: u32 = 256;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 14 {
        0 => {
            if let Some(m) = decode::<pb::JobSpec>(bytes) {
                job_spec(m);
            }
        }
        1 => {
            if let Some(m) = decode::<pb::JobRef>(bytes) {
                assert_eq!(job_id(&m).0, m.job_id);
            }
        }
        2 => {
            decode::<pb::ListJobsRequest>(bytes);
        }
        3 => {
            decode::<pb::ListWorkersRequest>(bytes);
        }
        4 => {
            if let Some(m) = decode::<pb::MissingBlobsRequest>(bytes) {
                m.digests.iter().for_each(|d| check_digest(d));
            }
        }
        5 => {
            if let Some(m) = decode::<pb::BlobChunk>(bytes) {
                check_digest(&m.digest);
            }
        }
        6 => {
            if let Some(m) = decode::<pb::GetBlobRequest>(bytes) {
                check_digest(&m.digest);
            }
        }
        7 => {
            if let Some(m) = decode::<pb::WorkerInfo>(bytes) {
                worker_info(m);
            }
        }
        8 => {
            if let Some(m) = decode::<pb::LeaseRequest>(bytes) {
                // The lease handler keeps the cached scenes that parse.
                m.cached_scenes.iter().for_each(|d| check_digest(d));
            }
        }
        9 => {
            if let Some(m) = decode::<pb::ProgressRequest>(bytes) {
                check_lease(&m.lease_id);
            }
        }
        10 => {
            if let Some(m) = decode::<pb::CompleteRequest>(bytes) {
                for o in m.outputs {
                    let want = o.clone();
                    if let Ok(out) = FrameOutput::try_from(o) {
                        // Back to the wire: the same output, digest in canonical form.
                        let back = pb::FrameOutput::from(&out);
                        assert_eq!(back.frame, want.frame);
                        assert_eq!(back.ext, want.ext);
                        assert_eq!(back.size, want.size);
                        assert_eq!(back.digest, want.digest.to_ascii_lowercase());
                    }
                }
                check_lease(&m.lease_id);
            }
        }
        11 => {
            if let Some(m) = decode::<pb::FailRequest>(bytes) {
                check_lease(&m.lease_id);
            }
        }
        12 => {
            if let Some(m) = decode::<pb::ReleaseRequest>(bytes) {
                check_lease(&m.lease_id);
            }
        }
        13 => {
            if let Some(m) = decode::<pb::TelemetryRequest>(bytes) {
                m.gpus.into_iter().for_each(check_gpu);
                m.slot_info.iter().for_each(|s| {
                    let cap = slot_cap(s);
                    assert_eq!((cap.slot, cap.gpu, cap.vram_bytes), (s.slot, s.gpu, s.vram_bytes));
                });
            }
        }
        _ => unreachable!(),
    }
});

/// Decodes `bytes` as `M`; on success checks that re-encoding round-trips.
fn decode<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let wire = m.encode_to_vec();
    assert_eq!(wire.len(), m.encoded_len());
    let again = M::decode(wire.as_slice()).expect("a re-encoded message decodes");
    // Compare encodings: a NaN double makes `==` false on equal messages.
    assert_eq!(again.encode_to_vec(), wire, "re-encoding is not stable");
    #[allow(clippy::eq_op)]
    if m == m {
        assert_eq!(again, m);
    }
    Some(m)
}

/// What `Farm::submit` does with a job spec, up to touching the store.
fn job_spec(m: pb::JobSpec) {
    let sub = Submission::try_from(m.clone());
    let scene = digest("scene_digest", &m.scene_digest);
    assert_eq!(sub.is_ok(), scene.is_ok());
    // The owner comes from the caller's token, never from the message.
    assert!(sub.as_ref().map_or(true, |s| s.owner.is_empty()));
    check_digest(&m.scene_digest);

    if let Ok(set) = FrameSet::parse(&m.frames, MAX_FRAMES) {
        assert!(!set.is_empty() && set.len() as u64 <= MAX_FRAMES);
        let chunks = set.chunks(m.chunk.max(1));
        assert_eq!(chunks.concat(), set.frames());
    }

    let grid = match m.tiles.trim() {
        "" => Ok(Grid::WHOLE),
        t => t.parse::<Grid>(),
    };
    if let Ok(grid) = grid {
        assert!(grid.cols >= 1 && grid.rows >= 1);
        assert_eq!(grid.to_string().parse::<Grid>(), Ok(grid));
        if let Some(info) = &m.scene_info {
            // `--max-pixels` is checked on the scene's size before any split.
            let limit = PixelLimit::default();
            let (w, h) = (u64::from(info.width), u64::from(info.height));
            let fits = limit.check("the scene's output", w, h).is_ok();
            assert_eq!(fits, w <= 16384 && h <= 16384);
            if let Ok(rects) = tiles::split(info.width, info.height, grid, MAX_TILES) {
                assert_eq!(rects.len() as u64, grid.count());
                let area: u64 = rects.iter().map(|r| u64::from(r.w) * u64::from(r.h)).sum();
                assert_eq!(area, u64::from(info.width) * u64::from(info.height));
            }
        }
    }

    if let Ok(req) = Requirements::parse(&m.device, m.min_vram_gb, &m.tags) {
        assert!(req.tags.len() <= 16);
        assert!(req.tags.windows(2).all(|w| w[0] < w[1]));
        assert!(m.min_vram_gb.is_finite() && (0.0..=4096.0).contains(&m.min_vram_gb));
    }
}

/// What `register` does with a worker's description.
fn worker_info(m: pb::WorkerInfo) {
    let gpus = m.gpus.clone();
    let slots = m.slot_info.clone();
    let reg = Registration::from(m.clone());
    assert_eq!(reg.gpus.len(), gpus.len());
    assert_eq!(reg.slot_caps.len(), slots.len());
    assert_eq!(reg.previous.is_some(), !m.previous_id.is_empty());
    // The owner comes from the caller's token, never from the message.
    assert!(reg.owner.is_empty());
    gpus.into_iter().for_each(check_gpu);
    // Tags reach `Requirements` matching; cached scenes are digests.
    let _ = Requirements::parse(&m.device, 0.0, &m.tags);
    m.cached_scenes.iter().for_each(|d| check_digest(d));
}

/// A GPU from the wire is trimmed to sane sizes and readings.
fn check_gpu(g: pb::Gpu) {
    let want = g.clone();
    let gpu = Gpu::from(g);
    assert_eq!(gpu.index, want.index);
    assert_eq!(gpu.memory_bytes, want.memory_bytes);
    assert!(gpu.name.chars().count() <= 200);
    assert!(gpu.vendor.chars().count() <= 100);
    assert!(gpu.device_type.chars().count() <= 40);
    assert!(gpu.uuid.chars().count() <= 100);
    assert_eq!(gpu.telemetry.is_some(), want.telemetry.is_some());
    if let Some(t) = gpu.telemetry {
        assert!(t.utilization_pct <= 100);
        assert!(t.power_w.is_finite());
    }
    // And back to the wire without loss of what was kept.
    let back = pb::Gpu::from(&gpu);
    assert_eq!(Gpu::from(back), gpu);
}

/// A digest that parses is the one written, in canonical (lowercase) form.
fn check_digest(s: &str) {
    if let Ok(d) = digest("digest", s) {
        assert_eq!(d.to_hex(), s.to_ascii_lowercase(), "{s:?} parses as another digest");
        assert_eq!(d.to_hex().parse::<Digest>(), Ok(d));
    }
}

/// A lease id that parses displays as one that parses back to it.
fn check_lease(s: &str) {
    if let Ok(id) = s.parse::<LeaseId>() {
        let shown = id.to_string();
        assert_eq!(shown.parse::<LeaseId>().ok(), Some(id), "{s:?} shows as {shown:?}");
    }
}
