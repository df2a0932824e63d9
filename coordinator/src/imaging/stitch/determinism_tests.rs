//! Stitched frames are deterministic: tiles whose Blender stamps differ (two
//! renders of one tile, real Blender 3.4.1 output from `worker/fixtures/`)
//! stitch to the same bytes, so a stitched frame's digest depends on its
//! pixels alone.

use super::*;

const PNG_A: &[u8] = include_bytes!("../../../../worker/fixtures/stamped_a.png");
const PNG_B: &[u8] = include_bytes!("../../../../worker/fixtures/stamped_b.png");
const EXR_A: &[u8] = include_bytes!("../../../../worker/fixtures/stamped_a.exr");
const EXR_B: &[u8] = include_bytes!("../../../../worker/fixtures/stamped_b.exr");

fn whole(bytes: &[u8]) -> Vec<u8> {
    let r = Rect {
        x: 0,
        y: 0,
        w: 16,
        h: 12,
    };
    let piece = TilePiece {
        inner: r,
        rendered: r,
        bytes,
    };
    stitch(16, 12, &[piece]).unwrap().0
}

#[test]
fn tiles_with_different_stamps_stitch_to_the_same_bytes() {
    for (a, b) in [(PNG_A, PNG_B), (EXR_A, EXR_B)] {
        assert_ne!(a, b);
        let frame = whole(a);
        assert_eq!(frame, whole(b), "stamps leaked into the stitched frame");
        assert_eq!(frame, whole(a), "stitching twice differs");
    }
}
