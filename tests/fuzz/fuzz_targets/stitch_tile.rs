//! `stitch::stitch_within` on one arbitrary "tile" covering a small frame:
//! it never panics, and it never allocates for an image larger than the
//! frame it was asked for (libFuzzer's `-malloc_limit_mb` catches that: a
//! header claiming a huge size, or thousands of channels, must be refused on
//! the header).
//!
//! Input layout: byte 0 picks the frame width (1..=64), byte 1 the height
//! (1..=64), byte 2 the pixel limit's side (1..=64), the rest is the file.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_coordinator::imaging::limits::PixelLimit;
use tessera_coordinator::imaging::stitch::{stitch_within, StitchError, TilePiece};
use tessera_coordinator::model::tiles::Rect;

fuzz_target!(|data: &[u8]| {
    let Some((head, file)) = data.split_first_chunk::<3>() else {
        return;
    };
    let side = |b: u8| u32::from(b % 64) + 1;
    let (width, height) = (side(head[0]), side(head[1]));
    let limit = PixelLimit {
        width: side(head[2]),
        height: side(head[2]),
    };
    let frame = Rect {
        x: 0,
        y: 0,
        w: width,
        h: height,
    };
    let piece = TilePiece {
        inner: frame,
        rendered: frame,
        bytes: file,
    };
    match stitch_within(limit, width, height, &[piece]) {
        Ok((bytes, ext)) => {
            assert!(limit.check("frame", width.into(), height.into()).is_ok());
            assert!(ext == "png" || ext == "exr");
            assert!(!bytes.is_empty());
        }
        Err(StitchError::TooLarge(_)) => {
            assert!(limit.check("frame", width.into(), height.into()).is_err());
        }
        Err(_) => {}
    }
});
