//! `FrameSet::parse` on arbitrary text, with the set's invariants checked on
//! every accepted input.
//!
//! Input layout: bytes 0..3 pick the frame limit (little-endian, modulo
//! 100_001), byte 3 the chunk size, the rest is the frame-set text (UTF-8).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_coordinator::model::frames::{FrameSet, FrameSetError};

/// The coordinator's default `max_frames`; the limit is drawn from 0..=this.
const MAX_FRAMES: u64 = 100_000;

fuzz_target!(|data: &[u8]| {
    let Some((head, text)) = data.split_first_chunk::<4>() else {
        return;
    };
    let Ok(spec) = std::str::from_utf8(text) else {
        return;
    };
    let max = u64::from(u32::from_le_bytes([head[0], head[1], head[2], 0])) % (MAX_FRAMES + 1);
    let chunk = u32::from(head[3]);

    let set = match FrameSet::parse(spec, max) {
        Ok(set) => set,
        Err(FrameSetError::TooMany { count, max: m }) => {
            assert_eq!(m, max, "TooMany reports another limit");
            assert!(count > max, "TooMany with {count} frames under the limit {max}");
            return;
        }
        Err(_) => return,
    };

    let frames = set.frames();
    assert!(!set.is_empty(), "{spec:?} parsed to an empty set");
    assert_eq!(set.len(), frames.len());
    assert!(set.len() as u64 <= max, "{spec:?}: {} frames over {max}", set.len());
    assert!(
        frames.windows(2).all(|w| w[0] < w[1]),
        "{spec:?}: frames not strictly ascending"
    );

    // Display writes a spec that parses back to the same set.
    let shown = set.to_string();
    let again = FrameSet::parse(&shown, max)
        .unwrap_or_else(|e| panic!("{spec:?} displays as {shown:?}, which fails: {e}"));
    assert_eq!(again, set, "{spec:?} displays as {shown:?}, another set");
    assert_eq!(again.to_string(), shown, "Display is not stable");

    // Chunks cover every frame, in order, none empty, none too long.
    let size = chunk.max(1) as usize;
    let chunks = set.chunks(chunk);
    assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= size));
    assert_eq!(chunks.len(), frames.len().div_ceil(size));
    assert_eq!(chunks.concat(), frames);
});
