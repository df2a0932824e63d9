//! Images and videos the coordinator makes from rendered blobs: frames
//! stitched from tiles pixel for pixel ([`stitch`]), frames decoded for
//! people ([`frame_image`]), preview videos with ffmpeg ([`video`]), and the
//! size limits checked before any of them allocates ([`limits`]). Knows the
//! model's value types and the blob store; never the farm.

pub mod frame_image;
pub mod limits;
pub mod stitch;
pub mod video;
