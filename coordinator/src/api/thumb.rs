//! Frame thumbnails for the dashboard and the add-on: a PNG or OpenEXR frame
//! scaled down (box filter) to a small 8-bit PNG. EXR frames hold linear
//! light, often above 1.0: they are tone-mapped (the Reinhard curve, then
//! the sRGB transfer curve) so that a thumbnail is never black or
//! clipped white.

use std::io::Cursor;

use crate::error::Error;
use crate::limits::PixelLimit;

/// The largest thumbnail side accepted (`?thumb=N`).
pub const MAX_SIDE: u32 = 1024;

/// Linear RGBA samples, row by row.
struct Pixels {
    width: u32,
    height: u32,
    /// Four values a pixel.
    rgba: Vec<f32>,
}

fn undecodable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "the frame is not a readable {what} ({e}); fetch it whole with `tessera fetch`"
    ))
}

/// A PNG thumbnail of the frame `bytes` (`ext` is `png` or `exr`), at most
/// `side` pixels wide and high (never larger than the frame).
pub fn thumbnail(bytes: &[u8], ext: &str, side: u32, limit: PixelLimit) -> Result<Vec<u8>, Error> {
    let side = side.clamp(1, MAX_SIDE);
    let (image, linear) = match ext {
        "png" => (decode_png(bytes, limit)?, false),
        "exr" => (decode_exr(bytes, limit)?, true),
        other => {
            return Err(Error::invalid(format!(
                "cannot make a thumbnail of a .{other} frame; fetch it whole without ?thumb"
            )))
        }
    };
    let small = shrink(&image, side);
    encode(&small, linear)
}

fn decode_png(bytes: &[u8], limit: PixelLimit) -> Result<Pixels, Error> {
    let bad = |e: png::DecodingError| undecodable("PNG", e);
    let need = limit.max_area().saturating_mul(8).saturating_add(1 << 20);
    let limits = png::Limits {
        bytes: usize::try_from(need).unwrap_or(usize::MAX),
    };
    let mut decoder = png::Decoder::new_with_limits(Cursor::new(bytes), limits);
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
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
    let line = out.line_size;
    let mut rgba = Vec::with_capacity(w as usize * h as usize * 4);
    for y in 0..h as usize {
        let row = &data[y * line..];
        for x in 0..w as usize {
            let p = &row[x * channels..(x + 1) * channels];
            let v = |i: usize| f32::from(p[i]) / 255.0;
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
    })
}

fn decode_exr(bytes: &[u8], limit: PixelLimit) -> Result<Pixels, crate::error::Error> {
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
    if header.channels.list.len() > crate::limits::MAX_CHANNELS {
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
    })
}

/// Averages boxes of pixels so the longer side is at most `side`.
fn shrink(image: &Pixels, side: u32) -> Pixels {
    let (w, h) = (image.width.max(1), image.height.max(1));
    let longest = w.max(h);
    if longest <= side || image.rgba.is_empty() {
        return Pixels {
            width: image.width,
            height: image.height,
            rgba: image.rgba.clone(),
        };
    }
    let nw = (u64::from(w) * u64::from(side) / u64::from(longest)).max(1) as u32;
    let nh = (u64::from(h) * u64::from(side) / u64::from(longest)).max(1) as u32;
    let mut rgba = Vec::with_capacity(nw as usize * nh as usize * 4);
    for y in 0..nh {
        let (y0, y1) = (y * h / nh, ((y + 1) * h / nh).max(y * h / nh + 1));
        for x in 0..nw {
            let (x0, x1) = (x * w / nw, ((x + 1) * w / nw).max(x * w / nw + 1));
            let mut sum = [0f32; 4];
            for sy in y0..y1 {
                for sx in x0..x1 {
                    let i = (sy as usize * w as usize + sx as usize) * 4;
                    for (s, v) in sum.iter_mut().zip(&image.rgba[i..i + 4]) {
                        // NaN and infinities (a broken render) count as black.
                        *s += if v.is_finite() { *v } else { 0.0 };
                    }
                }
            }
            let n = ((y1 - y0) * (x1 - x0)) as f32;
            rgba.extend(sum.iter().map(|s| s / n));
        }
    }
    Pixels {
        width: nw,
        height: nh,
        rgba,
    }
}

/// Linear light to display: the Reinhard curve `x / (1 + x)`, which keeps
/// dim light visible and brings any highlight below white, then sRGB.
fn tone_map(v: f32) -> f32 {
    let v = v.max(0.0);
    srgb(v / (1.0 + v))
}

fn srgb(v: f32) -> f32 {
    let v = v.clamp(0.0, 1.0);
    if v <= 0.003_130_8 {
        v * 12.92
    } else {
        1.055 * v.powf(1.0 / 2.4) - 0.055
    }
}

fn encode(image: &Pixels, linear: bool) -> Result<Vec<u8>, Error> {
    let to8 = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round() as u8;
    let mut px = Vec::with_capacity(image.rgba.len());
    for p in image.rgba.chunks_exact(4) {
        if linear {
            px.extend_from_slice(&[
                to8(tone_map(p[0])),
                to8(tone_map(p[1])),
                to8(tone_map(p[2])),
                to8(p[3]),
            ]);
        } else {
            px.extend(p.iter().map(|v| to8(*v)));
        }
    }
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, image.width.max(1), image.height.max(1));
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let fail = |e: png::EncodingError| Error::invalid(format!("cannot encode a thumbnail: {e}"));
    let mut writer = enc.write_header().map_err(fail)?;
    writer.write_image_data(&px).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_of(w: u32, h: u32, color: png::ColorType, px: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(color);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(px).unwrap();
        wr.finish().unwrap();
        out
    }

    fn decoded(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let mut r = png::Decoder::new(Cursor::new(png_bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgba);
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    #[test]
    fn a_png_frame_shrinks_keeping_its_aspect_and_colour() {
        let (w, h) = (40, 20);
        let px: Vec<u8> = (0..w * h).flat_map(|_| [200u8, 100, 50]).collect();
        let frame = png_of(w, h, png::ColorType::Rgb, &px);
        let thumb = thumbnail(&frame, "png", 10, PixelLimit::default()).unwrap();
        let (tw, th, data) = decoded(&thumb);
        assert_eq!((tw, th), (10, 5));
        assert_eq!(&data[..4], &[200, 100, 50, 255]);
    }

    #[test]
    fn a_small_frame_is_not_enlarged() {
        let frame = png_of(3, 2, png::ColorType::Grayscale, &[0, 128, 255, 0, 128, 255]);
        let (tw, th, data) =
            decoded(&thumbnail(&frame, "png", 256, PixelLimit::default()).unwrap());
        assert_eq!((tw, th), (3, 2));
        assert_eq!(&data[4..8], &[128, 128, 128, 255]);
    }

    #[test]
    fn an_exr_frame_is_tone_mapped_not_black_nor_clipped() {
        use exr::prelude::*;
        let (w, h) = (16usize, 8usize);
        // Dim linear light (0.05) on the left, very bright (20.0) on the right.
        let image = Image::from_channels(
            (w, h),
            SpecificChannels::rgba(|p: Vec2<usize>| {
                let v = if p.0 < w / 2 { 0.05f32 } else { 20.0 };
                (v, v, v, 1.0f32)
            }),
        );
        let mut bytes = Vec::new();
        image.write().to_buffered(Cursor::new(&mut bytes)).unwrap();
        let thumb = thumbnail(&bytes, "exr", 8, PixelLimit::default()).unwrap();
        let (tw, th, data) = decoded(&thumb);
        assert_eq!((tw, th), (8, 4));
        let dim = data[0];
        let bright = data[(tw as usize - 1) * 4];
        assert!(dim > 40, "dim light must stay visible, got {dim}");
        assert!(
            bright > dim && bright < 255,
            "bright light must not clip: {bright}"
        );
    }

    #[test]
    fn garbage_is_a_clear_error_not_a_panic() {
        for ext in ["png", "exr"] {
            let e = thumbnail(b"not an image", ext, 64, PixelLimit::default()).unwrap_err();
            assert!(e.to_string().contains("not a readable"), "{e}");
        }
        let e = thumbnail(b"x", "tiff", 64, PixelLimit::default()).unwrap_err();
        assert!(e.to_string().contains(".tiff"), "{e}");
    }
}
