//! Rendered frames as pictures for people: a PNG (8 or 16 bits, grey or
//! colour, with or without alpha) or an OpenEXR frame decoded to RGBA
//! samples, and those samples brought down to 8-bit sRGB for display. Used
//! by the dashboard's thumbnails ([`crate::adapters::api::thumb`]) and the preview
//! videos ([`crate::model::preview`]).
//!
//! PNG samples are display-referred already (Blender writes them through
//! its view transform): 16-bit ones are only rounded to 8 bits. OpenEXR
//! samples hold linear light, often above 1.0: they are tone-mapped (the
//! Reinhard curve, then the sRGB transfer curve) so that a picture is never
//! black or clipped white.

use std::io::Cursor;

use crate::error::Error;
use crate::imaging::limits::PixelLimit;

/// RGBA samples, row by row, four values a pixel.
#[derive(Debug, Clone, PartialEq)]
pub struct Pixels {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Four values a pixel: display values in 0..=1 for a PNG, linear light
    /// for an OpenEXR frame (see [`Pixels::linear`]).
    pub rgba: Vec<f32>,
    /// Whether the samples are linear light (OpenEXR) rather than display values.
    pub linear: bool,
}

fn undecodable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "the frame is not a readable {what} ({e}); fetch it whole with `tessera fetch`"
    ))
}

/// Decodes the frame `bytes` whose file extension is `ext` (`png` or
/// `exr`), refusing one over `limit` before its pixels are decoded.
pub fn decode(bytes: &[u8], ext: &str, limit: PixelLimit) -> Result<Pixels, Error> {
    match ext {
        "png" => decode_png(bytes, limit),
        "exr" => decode_exr(bytes, limit),
        other => Err(Error::invalid(format!(
            "cannot show a .{other} frame as a picture; only PNG and OpenEXR frames can (set Output Properties > File Format to one of them)"
        ))),
    }
}

fn decode_png(bytes: &[u8], limit: PixelLimit) -> Result<Pixels, Error> {
    let bad = |e: png::DecodingError| undecodable("PNG", e);
    let need = limit.max_area().saturating_mul(8).saturating_add(1 << 20);
    let limits = png::Limits {
        bytes: usize::try_from(need).unwrap_or(usize::MAX),
    };
    let mut decoder = png::Decoder::new_with_limits(Cursor::new(bytes), limits);
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().map_err(bad)?;
    let (w, h) = (reader.info().width, reader.info().height);
    limit
        .check("the frame", u64::from(w), u64::from(h))
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| undecodable("PNG", "image too large"))?;
    let mut data = vec![0; size];
    let out = reader.next_frame(&mut data).map_err(bad)?;
    let channels = match out.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err(undecodable("PNG", "indexed colour")),
    };
    // EXPAND makes every sample 8 or 16 bits (big-endian).
    let wide = out.bit_depth == png::BitDepth::Sixteen;
    let bytes_per = if wide { 2 } else { 1 };
    let sample = |s: &[u8], i: usize| -> f32 {
        if wide {
            f32::from(u16::from_be_bytes([s[2 * i], s[2 * i + 1]])) / 65535.0
        } else {
            f32::from(s[i]) / 255.0
        }
    };
    let line = out.line_size;
    let mut rgba = Vec::with_capacity(w as usize * h as usize * 4);
    for y in 0..h as usize {
        let row = &data[y * line..];
        for x in 0..w as usize {
            let p = &row[x * channels * bytes_per..(x + 1) * channels * bytes_per];
            let v = |i: usize| sample(p, i);
            let px = match channels {
                1 => [v(0), v(0), v(0), 1.0],
                2 => [v(0), v(0), v(0), v(1)],
                3 => [v(0), v(1), v(2), 1.0],
                _ => [v(0), v(1), v(2), v(3)],
            };
            rgba.extend_from_slice(&px);
        }
    }
    Ok(Pixels {
        width: w,
        height: h,
        rgba,
        linear: false,
    })
}

fn decode_exr(bytes: &[u8], limit: PixelLimit) -> Result<Pixels, Error> {
    // The prelude has an `Error` of its own: ours is named again after it.
    use crate::error::Error;
    use exr::prelude::*;
    let bad = |e: exr::error::Error| undecodable("OpenEXR", e);
    let meta = MetaData::read_from_buffered(Cursor::new(bytes), false).map_err(bad)?;
    let header = meta
        .headers
        .first()
        .ok_or_else(|| undecodable("OpenEXR", "no header"))?;
    let size = header.layer_size;
    limit
        .check("the frame", size.0 as u64, size.1 as u64)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    if header.channels.list.len() > crate::imaging::limits::MAX_CHANNELS {
        return Err(undecodable("OpenEXR", "too many channels"));
    }
    let image = read()
        .no_deep_data()
        .largest_resolution_level()
        .all_channels()
        .first_valid_layer()
        .all_attributes()
        .non_parallel()
        .from_buffered(Cursor::new(bytes))
        .map_err(bad)?;
    let layer = image.layer_data;
    let (w, h) = (layer.size.0, layer.size.1);
    // Channels are named `R` or `<layer>.<pass>.R` (multilayer): take the
    // first of each colour, so the beauty pass of a multilayer file.
    let find = |c: &str| {
        layer.channel_data.list.iter().find(|ch| {
            let name = ch.name.to_string();
            name == c || name.ends_with(&format!(".{c}"))
        })
    };
    let (r, g, b, a) = (find("R"), find("G"), find("B"), find("A"));
    let grey = r.or(g).or(b).or(layer.channel_data.list.first());
    let mut rgba = Vec::with_capacity(w * h * 4);
    let sample = |c: Option<&AnyChannel<FlatSamples>>, i: usize, default: f32| {
        c.map_or(default, |c| c.sample_data.value_by_flat_index(i).to_f32())
    };
    for i in 0..w * h {
        let k = sample(grey, i, 0.0);
        rgba.extend_from_slice(&[
            sample(r, i, k),
            sample(g, i, k),
            sample(b, i, k),
            sample(a, i, 1.0),
        ]);
    }
    Ok(Pixels {
        width: w as u32,
        height: h as u32,
        rgba,
        linear: true,
    })
}

/// Linear light to display: the Reinhard curve `x / (1 + x)`, which keeps
/// dim light visible and brings any highlight below white, then sRGB.
pub fn tone_map(v: f32) -> f32 {
    let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
    srgb(v / (1.0 + v))
}

/// The sRGB transfer curve of a linear value in 0..=1.
pub fn srgb(v: f32) -> f32 {
    let v = v.clamp(0.0, 1.0);
    if v <= 0.003_130_8 {
        v * 12.92
    } else {
        1.055 * v.powf(1.0 / 2.4) - 0.055
    }
}

/// A display value in 0..=1 as an 8-bit sample (NaN counts as black).
pub fn to8(v: f32) -> u8 {
    if v.is_nan() {
        return 0;
    }
    (v.clamp(0.0, 1.0) * 255.0).round() as u8
}

/// One RGBA pixel for display, 8 bits a channel: tone-mapped when the
/// samples are linear light.
pub fn display_rgba(p: &[f32], linear: bool) -> [u8; 4] {
    if linear {
        [
            to8(tone_map(p[0])),
            to8(tone_map(p[1])),
            to8(tone_map(p[2])),
            to8(p[3]),
        ]
    } else {
        [to8(p[0]), to8(p[1]), to8(p[2]), to8(p[3])]
    }
}

/// The picture as opaque 8-bit sRGB, three bytes a pixel, for a video that
/// has no alpha. A PNG's colour is straight (not premultiplied), so it is
/// laid over black by its alpha; an OpenEXR frame from Blender is
/// premultiplied already, so its alpha is only dropped.
pub fn to_rgb8(image: &Pixels) -> Vec<u8> {
    let mut out = Vec::with_capacity(image.rgba.len() / 4 * 3);
    for p in image.rgba.chunks_exact(4) {
        if image.linear {
            out.extend_from_slice(&[
                to8(tone_map(p[0])),
                to8(tone_map(p[1])),
                to8(tone_map(p[2])),
            ]);
        } else {
            let a = if p[3].is_finite() {
                p[3].clamp(0.0, 1.0)
            } else {
                0.0
            };
            out.extend_from_slice(&[to8(p[0] * a), to8(p[1] * a), to8(p[2] * a)]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_of(w: u32, h: u32, color: png::ColorType, depth: png::BitDepth, px: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(px).unwrap();
        wr.finish().unwrap();
        out
    }

    #[test]
    fn a_16_bit_png_is_scaled_to_8_bits_not_cut_to_its_high_byte() {
        // 0xff00 is 254.0/255 of full scale; its high byte would say 255.
        let px: Vec<u8> = [0xffu8, 0x00].repeat(3);
        let frame = png_of(1, 1, png::ColorType::Rgb, png::BitDepth::Sixteen, &px);
        let image = decode(&frame, "png", PixelLimit::default()).unwrap();
        assert!(!image.linear);
        assert_eq!(to_rgb8(&image), vec![254, 254, 254]);
    }

    #[test]
    fn straight_alpha_is_laid_over_black() {
        let frame = png_of(
            2,
            1,
            png::ColorType::Rgba,
            png::BitDepth::Eight,
            &[200, 100, 50, 255, 200, 100, 50, 0],
        );
        let image = decode(&frame, "png", PixelLimit::default()).unwrap();
        assert_eq!(to_rgb8(&image), vec![200, 100, 50, 0, 0, 0]);
    }

    #[test]
    fn linear_light_is_tone_mapped_and_never_clips() {
        let image = Pixels {
            width: 3,
            height: 1,
            rgba: vec![
                0.0,
                0.0,
                0.0,
                1.0,
                0.05,
                0.05,
                0.05,
                1.0,
                20.0,
                f32::NAN,
                f32::INFINITY,
                1.0,
            ],
            linear: true,
        };
        let rgb = to_rgb8(&image);
        assert_eq!(&rgb[..3], &[0, 0, 0]);
        assert!(rgb[3] > 40, "dim light stays visible: {}", rgb[3]);
        assert!(
            rgb[6] < 255 && rgb[6] > 240,
            "bright light is near white: {}",
            rgb[6]
        );
        assert_eq!(&rgb[7..], &[0, 0], "NaN and infinity count as black");
    }

    #[test]
    fn other_formats_are_a_clear_error() {
        let e = decode(b"x", "tif", PixelLimit::default()).unwrap_err();
        assert!(e.to_string().contains(".tif"), "{e}");
        let e = decode(b"garbage", "png", PixelLimit::default()).unwrap_err();
        assert!(e.to_string().contains("not a readable PNG"), "{e}");
    }
}
