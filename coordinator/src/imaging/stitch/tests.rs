//! Tests of stitching: round trips of every supported encoding, and refusals.

use super::openexr::{exr_format, ExrImage};
use super::*;
use crate::imaging::limits::PixelLimit;
use crate::model::tiles::{split, with_overscan, Grid};
use exr::prelude::{self as x, ReadChannels, ReadLayers, WritableImage};
use proptest::prelude::*;

fn encode_png(w: u32, h: u32, format: PngFormat, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(format.color);
    enc.set_depth(format.depth);
    let mut writer = enc.write_header().unwrap();
    writer.write_image_data(data).unwrap();
    writer.finish().unwrap();
    out
}

fn decode_png(bytes: &[u8]) -> (u32, u32, PngFormat, Vec<u8>) {
    let mut reader = png::Decoder::new(Cursor::new(bytes)).read_info().unwrap();
    let mut data = vec![0; reader.output_buffer_size().unwrap()];
    reader.next_frame(&mut data).unwrap();
    let info = reader.info();
    let format = PngFormat {
        color: info.color_type,
        depth: info.bit_depth,
    };
    (info.width, info.height, format, data)
}

/// Cuts `rect` out of a row-major image `w` wide.
fn crop<T: Copy>(full: &[T], w: u32, rect: Rect, per_px: usize) -> Vec<T> {
    let mut out = Vec::new();
    for row in rect.y..rect.bottom() {
        let s = (row as usize * w as usize + rect.x as usize) * per_px;
        out.extend_from_slice(&full[s..s + rect.w as usize * per_px]);
    }
    out
}

/// A full image whose every byte differs from its neighbours.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// The tiles of a grid with overscan, each encoded by `encode` from the full image.
fn pieces(w: u32, h: u32, grid: Grid, overscan: u32) -> Vec<(Rect, Rect)> {
    split(w, h, grid, 64)
        .unwrap()
        .into_iter()
        .map(|t| (t, with_overscan(t, overscan, w, h)))
        .collect()
}

fn png_round_trip(w: u32, h: u32, format: PngFormat, grid: Grid, overscan: u32) {
    let per_px = format.bytes_per_pixel();
    let full = pattern(w as usize * h as usize * per_px);
    let rects = pieces(w, h, grid, overscan);
    let files: Vec<Vec<u8>> = rects
        .iter()
        .map(|&(_, r)| encode_png(r.w, r.h, format, &crop(&full, w, r, per_px)))
        .collect();
    let tiles: Vec<TilePiece<'_>> = rects
        .iter()
        .zip(&files)
        .map(|(&(inner, rendered), bytes)| TilePiece {
            inner,
            rendered,
            bytes,
        })
        .collect();
    let (bytes, ext) = stitch(w, h, &tiles).unwrap();
    assert_eq!(ext, "png");
    let (got_w, got_h, got_format, data) = decode_png(&bytes);
    assert_eq!((got_w, got_h, got_format), (w, h, format));
    assert!(
        data == full,
        "{format} {grid} overscan {overscan}: pixels differ"
    );
}

#[test]
fn png_tiles_stitch_back_to_the_full_image() {
    use png::{BitDepth::*, ColorType::*};
    for (color, depth) in [
        (Rgb, Eight),
        (Rgb, Sixteen),
        (Rgba, Eight),
        (Rgba, Sixteen),
        (Grayscale, Eight),
        (GrayscaleAlpha, Sixteen),
    ] {
        let format = PngFormat { color, depth };
        png_round_trip(321, 239, format, Grid { cols: 4, rows: 3 }, 16);
        png_round_trip(64, 48, format, Grid { cols: 3, rows: 2 }, 0);
        png_round_trip(5, 3, format, Grid::WHOLE, 16);
    }
}

/// An RGBA layer covering `rect` of a frame whose samples depend on the frame position.
fn exr_layer(half: bool, rect: Rect) -> x::Layer<x::AnyChannels<x::FlatSamples>> {
    let channels = ["R", "G", "B", "A"]
        .iter()
        .enumerate()
        .map(|(c, name)| {
            let value = |i: usize| {
                let (px, py) = (
                    (i % rect.w as usize) as u32 + rect.x,
                    (i / rect.w as usize) as u32 + rect.y,
                );
                (px * 3 + py * 1000 + c as u32) as f32 / 7.0
            };
            let n = rect.w as usize * rect.h as usize;
            let samples = if half {
                x::FlatSamples::F16((0..n).map(|i| x::f16::from_f32(value(i))).collect())
            } else {
                x::FlatSamples::F32((0..n).map(value).collect())
            };
            x::AnyChannel::new(*name, samples)
        })
        .collect();
    x::Layer::new(
        (rect.w as usize, rect.h as usize),
        x::LayerAttributes::default(),
        x::Encoding::SMALL_LOSSLESS,
        x::AnyChannels::sort(channels),
    )
}

fn encode_exr(layer: x::Layer<x::AnyChannels<x::FlatSamples>>) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    x::Image::from_layer(layer)
        .write()
        .non_parallel()
        .to_buffered(&mut out)
        .unwrap();
    out.into_inner()
}

#[test]
fn exr_tiles_stitch_back_to_the_full_image() {
    for half in [false, true] {
        let (w, h) = (321, 239);
        let frame = Rect { x: 0, y: 0, w, h };
        let files: Vec<(Rect, Rect, Vec<u8>)> = pieces(w, h, Grid { cols: 4, rows: 3 }, 16)
            .into_iter()
            .map(|(inner, r)| (inner, r, encode_exr(exr_layer(half, r))))
            .collect();
        let tiles: Vec<TilePiece<'_>> = files
            .iter()
            .map(|(inner, rendered, bytes)| TilePiece {
                inner: *inner,
                rendered: *rendered,
                bytes,
            })
            .collect();
        let (bytes, ext) = stitch(w, h, &tiles).unwrap();
        assert_eq!(ext, "exr");
        let meta = x::MetaData::read_from_buffered(Cursor::new(&bytes), false).unwrap();
        assert_eq!(meta.headers[0].compression, x::Compression::ZIP16);
        let image: ExrImage = x::read()
            .no_deep_data()
            .largest_resolution_level()
            .all_channels()
            .all_layers()
            .all_attributes()
            .from_buffered(Cursor::new(&bytes))
            .unwrap();
        let got = &image.layer_data[0];
        assert_eq!(got.size, x::Vec2(w as usize, h as usize));
        let want = exr_layer(half, frame);
        assert_eq!(
            exr_format(&got.channel_data),
            exr_format(&want.channel_data)
        );
        assert!(
            got.channel_data == want.channel_data,
            "half {half}: samples differ"
        );
    }
}

/// Two 80x60 tiles side by side, 8-bit RGB, no overscan.
fn two_tiles() -> ([Rect; 2], [Vec<u8>; 2]) {
    let format = PngFormat {
        color: png::ColorType::Rgb,
        depth: png::BitDepth::Eight,
    };
    let rects = [
        Rect {
            x: 0,
            y: 0,
            w: 80,
            h: 60,
        },
        Rect {
            x: 80,
            y: 0,
            w: 80,
            h: 60,
        },
    ];
    let files =
        rects.map(|r| encode_png(r.w, r.h, format, &pattern(r.w as usize * r.h as usize * 3)));
    (rects, files)
}

fn piece(r: Rect, bytes: &[u8]) -> TilePiece<'_> {
    TilePiece {
        inner: r,
        rendered: r,
        bytes,
    }
}

#[test]
fn refuses_a_tile_of_the_wrong_size() {
    let (rects, files) = two_tiles();
    let wide = encode_png(
        81,
        60,
        PngFormat {
            color: png::ColorType::Rgb,
            depth: png::BitDepth::Eight,
        },
        &pattern(81 * 60 * 3),
    );
    let err = stitch(
        160,
        60,
        &[piece(rects[0], &files[0]), piece(rects[1], &wide)],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("tile at 80,0 is 81x60 but should be 80x60;"),
        "{err}"
    );
    assert_eq!(err.tile(), Some(rects[1]));
}

#[test]
fn refuses_gaps_overlaps_and_strays() {
    let (rects, files) = two_tiles();
    let err = stitch(160, 60, &[piece(rects[0], &files[0])]).unwrap_err();
    assert!(
        matches!(err, StitchError::Gap { missing: 4800, .. }),
        "{err}"
    );
    let err = stitch(
        160,
        60,
        &[piece(rects[0], &files[0]), piece(rects[0], &files[1])],
    )
    .unwrap_err();
    assert!(matches!(err, StitchError::Overlap { .. }), "{err}");
    let err = stitch(
        150,
        60,
        &[piece(rects[0], &files[0]), piece(rects[1], &files[1])],
    )
    .unwrap_err();
    assert!(matches!(err, StitchError::BadRegion { .. }), "{err}");
    let mut stray = piece(rects[1], &files[1]);
    stray.inner.x = 79;
    let err = stitch(160, 60, &[piece(rects[0], &files[0]), stray]).unwrap_err();
    assert!(matches!(err, StitchError::BadRegion { .. }), "{err}");
    let mut huge = piece(rects[1], &files[1]);
    huge.inner.w = u32::MAX;
    huge.rendered.w = u32::MAX;
    let err = stitch(160, 60, &[piece(rects[0], &files[0]), huge]).unwrap_err();
    assert!(matches!(err, StitchError::BadRegion { .. }), "{err}");
    let err = stitch(160, 60, &[]).unwrap_err();
    assert!(matches!(err, StitchError::NoTiles { .. }), "{err}");
}

#[test]
fn refuses_mixed_unsupported_and_damaged_files() {
    let (rects, files) = two_tiles();
    let deep = encode_png(
        80,
        60,
        PngFormat {
            color: png::ColorType::Rgb,
            depth: png::BitDepth::Sixteen,
        },
        &pattern(80 * 60 * 6),
    );
    let err = stitch(
        160,
        60,
        &[piece(rects[0], &files[0]), piece(rects[1], &deep)],
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tile at 80,0 is PNG (RGB, 16-bit) but the first tile is PNG (RGB, 8-bit); \
         render every tile of a frame with the same output format"
    );
    let exr = encode_exr(exr_layer(false, rects[1]));
    let err = stitch(
        160,
        60,
        &[piece(rects[0], &files[0]), piece(rects[1], &exr)],
    )
    .unwrap_err();
    assert!(matches!(err, StitchError::MixedFormats { .. }), "{err}");
    let jpeg = [0xff, 0xd8, 0xff, 0xe0, 0, 0];
    let err = stitch(
        160,
        60,
        &[piece(rects[0], &jpeg), piece(rects[1], &files[1])],
    )
    .unwrap_err();
    assert!(
        matches!(err, StitchError::UnsupportedFormat { .. }),
        "{err}"
    );
    let cut = &files[1][..files[1].len() / 2];
    let err = stitch(160, 60, &[piece(rects[0], &files[0]), piece(rects[1], cut)]).unwrap_err();
    assert!(matches!(err, StitchError::Undecodable { .. }), "{err}");
    assert_eq!(err.tile(), Some(rects[1]));
    let cut = &exr[..exr.len() / 2];
    let err = stitch(80, 60, &[piece(rects[0], cut)]).unwrap_err();
    assert!(matches!(err, StitchError::Undecodable { .. }), "{err}");
    let wrong = encode_exr(exr_layer(
        true,
        Rect {
            x: 0,
            y: 0,
            w: 80,
            h: 61,
        },
    ));
    let err = stitch(80, 60, &[piece(rects[0], &wrong)]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("tile at 0,0 is 80x61 but should be 80x60;"),
        "{err}"
    );
}

#[test]
fn refuses_frames_over_the_pixel_limit_before_decoding() {
    let (rects, files) = two_tiles();
    let tiles = [piece(rects[0], &files[0]), piece(rects[1], &files[1])];
    let small: PixelLimit = "100x100".parse().unwrap();
    // 160x60 has fewer pixels than 100x100 but a side over 100.
    let err = stitch_within(small, 160, 60, &tiles).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "the frame is 160x60 pixels, over the coordinator's limit of 100x100 (--max-pixels);"
        ),
        "{err}"
    );
    assert_eq!(err.tile(), None);
    assert!(stitch_within("160x60".parse().unwrap(), 160, 60, &tiles).is_ok());
    // The default limit holds for `stitch` too, whatever the tiles claim.
    let huge = Rect {
        x: 0,
        y: 0,
        w: 20000,
        h: 20000,
    };
    let err = stitch(20000, 20000, &[piece(huge, &files[0])]).unwrap_err();
    assert!(matches!(err, StitchError::TooLarge(_)), "{err}");
}

#[test]
fn refuses_exr_tiles_with_too_many_channels_before_decoding() {
    let rect = Rect {
        x: 0,
        y: 0,
        w: 4,
        h: 2,
    };
    let layer = |channels: usize| {
        let list = (0..channels)
            .map(|c| {
                x::AnyChannel::new(
                    format!("c{c:03}").as_str(),
                    x::FlatSamples::F32(vec![c as f32; 8]),
                )
            })
            .collect();
        encode_exr(x::Layer::new(
            (4, 2),
            x::LayerAttributes::default(),
            x::Encoding::SMALL_LOSSLESS,
            x::AnyChannels::sort(list),
        ))
    };
    let many = layer(crate::imaging::limits::MAX_CHANNELS + 1);
    let err = stitch(4, 2, &[piece(rect, &many)]).unwrap_err();
    assert!(
        matches!(
            err,
            StitchError::TooManyChannels {
                count: 65,
                max: 64,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.tile(), Some(rect), "the tile is rendered again");
    assert!(stitch(4, 2, &[piece(rect, &layer(5))]).is_ok());
    // No more samples than an RGBA frame at the limit: a 4x2 tile at a 4x2
    // limit may carry 4 channels.
    let err = stitch_within("4x2".parse().unwrap(), 4, 2, &[piece(rect, &layer(5))]).unwrap_err();
    assert!(
        matches!(
            err,
            StitchError::TooManyChannels {
                count: 5,
                max: 4,
                ..
            }
        ),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn any_grid_and_overscan_round_trips(
        w in 1u32..90, h in 1u32..90, cols in 1u32..6, rows in 1u32..6, overscan in 0u32..20,
    ) {
        prop_assume!(cols <= w && rows <= h);
        let format = PngFormat { color: png::ColorType::Rgba, depth: png::BitDepth::Sixteen };
        png_round_trip(w, h, format, Grid { cols, rows }, overscan);
    }
}
