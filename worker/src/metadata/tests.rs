//! Tests on real Blender 3.4.1 output: two renders of one 16x12 frame from
//! scenes at different paths (as two workers' caches), PNG and OpenEXR, and
//! one with `Memory` and `Hostname` stamps (`worker/fixtures/`).

use super::*;

const PNG_A: &[u8] = include_bytes!("../../fixtures/stamped_a.png");
const PNG_B: &[u8] = include_bytes!("../../fixtures/stamped_b.png");
const PNG_MEMORY: &[u8] = include_bytes!("../../fixtures/stamped_memory.png");
const EXR_A: &[u8] = include_bytes!("../../fixtures/stamped_a.exr");
const EXR_B: &[u8] = include_bytes!("../../fixtures/stamped_b.exr");
const MULTILAYER_A: &[u8] = include_bytes!("../../fixtures/multilayer_a.exr");
const MULTILAYER_B: &[u8] = include_bytes!("../../fixtures/multilayer_b.exr");
const RGBA16_A: &[u8] = include_bytes!("../../fixtures/rgba16_a.png");
const RGBA16_B: &[u8] = include_bytes!("../../fixtures/rgba16_b.png");

fn keys(fields: &Fields) -> Vec<&str> {
    fields.iter().map(|(k, _)| k.as_str()).collect()
}

fn png_pixels(bytes: &[u8]) -> Vec<u8> {
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    buf
}

fn png_texts(bytes: &[u8]) -> Vec<String> {
    let reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    reader
        .info()
        .uncompressed_latin1_text
        .iter()
        .map(|t| t.keyword.clone())
        .collect()
}

#[test]
fn two_png_renders_differ_before_and_are_identical_after() {
    assert_ne!(PNG_A, PNG_B);
    let (a, fa) = strip_png(PNG_A).unwrap();
    let (b, fb) = strip_png(PNG_B).unwrap();
    assert_eq!(a, b, "stripped renders differ");
    for k in [
        "File",
        "Date",
        "RenderTime",
        "cycles.ViewLayer.samples",
        "cycles.ViewLayer.total_time",
        "cycles.ViewLayer.render_time",
        "cycles.ViewLayer.synchronization_time",
    ] {
        assert!(keys(&fa).contains(&k), "{k} not removed: {fa:?}");
    }
    assert_ne!(fa, fb, "the removed values differ between renders");
    // The pixels are untouched, the stable stamps stay, the rest is gone.
    assert_eq!(png_pixels(&a), png_pixels(PNG_A));
    assert_eq!(png_texts(&a), ["Time", "Frame", "Camera", "Scene"]);
    // Stripping is idempotent.
    assert_eq!(strip_png(&a).unwrap(), (a.clone(), Vec::new()));
}

#[test]
fn png_stats_come_from_the_stamps() {
    let (_, fields) = strip_png(PNG_MEMORY).unwrap();
    assert!(keys(&fields).contains(&"Hostname"));
    let s = stats(&fields);
    assert_eq!(s.samples, Some(4));
    assert_eq!(s.render_ms, Some(100), "RenderTime 00:00.10");
    assert_eq!(s.sync_ms, Some(90));
    assert_eq!(
        s.memory_peak_bytes,
        Some((1.12f64 * 1024.0 * 1024.0).round() as u64)
    );
}

fn exr_pixels(bytes: &[u8]) -> Vec<(String, Vec<f32>)> {
    use exr::prelude::*;
    let image = read()
        .no_deep_data()
        .largest_resolution_level()
        .all_channels()
        .all_layers()
        .all_attributes()
        .from_buffered(std::io::Cursor::new(bytes))
        .unwrap();
    let layer = &image.layer_data[0];
    layer
        .channel_data
        .list
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                c.sample_data.values_as_f32().collect::<Vec<f32>>(),
            )
        })
        .collect()
}

#[test]
fn two_exr_renders_are_identical_after_and_still_read() {
    assert_ne!(EXR_A.len(), EXR_B.len(), "the scene paths differ in length");
    let (a, fa) = strip_exr(EXR_A).unwrap();
    let (b, _) = strip_exr(EXR_B).unwrap();
    assert_eq!(a, b, "stripped renders differ");
    for k in ["File", "Date", "RenderTime", "cycles.ViewLayer.total_time"] {
        assert!(keys(&fa).contains(&k), "{k} not removed: {fa:?}");
    }
    assert!(!keys(&fa).contains(&"Frame"));
    // The offset table was shifted: the pixels read back the same.
    assert_eq!(exr_pixels(&a), exr_pixels(EXR_A));
    assert_eq!(stats(&fa).samples, Some(4));
    assert_eq!(strip_exr(&a).unwrap(), (a.clone(), Vec::new()));
}

#[test]
fn damaged_files_are_errors_never_panics() {
    for file in [PNG_A, EXR_A] {
        for n in 0..file.len() {
            let _ = strip(&file[..n]);
        }
        let mut bad = file.to_vec();
        for i in (8..bad.len()).step_by(7) {
            bad[i] ^= 0xa5;
            let _ = strip(&bad);
        }
    }
    assert!(strip_png(&PNG_A[..PNG_A.len() - 12]).is_err(), "no IEND");
    assert!(strip_exr(&EXR_A[..200]).is_err());
    assert_eq!(strip(b"GIF89a").unwrap(), None);
}

#[test]
fn blender_durations_and_memory() {
    assert_eq!(duration_ms("00:00.09"), Some(90));
    assert_eq!(duration_ms("01:02.50"), Some(62_500));
    assert_eq!(duration_ms("1:00:00.00"), Some(3_600_000));
    assert_eq!(duration_ms("soon"), None);
    assert_eq!(memory_bytes("512K"), Some(512 * 1024));
    assert_eq!(memory_bytes("2.00G"), Some(2 << 30));
    assert_eq!(memory_bytes("Mem: 10.0M, Peak: 12.0M"), Some(12 << 20));
    assert_eq!(memory_bytes("lots"), None);
}

#[test]
fn multilayer_exr_and_16_bit_rgba_png_too() {
    let (a, fa) = strip_exr(MULTILAYER_A).unwrap();
    let (b, _) = strip_exr(MULTILAYER_B).unwrap();
    assert_eq!(a, b);
    assert!(keys(&fa).contains(&"RenderTime"), "{fa:?}");
    // Blender's reader recognises a multilayer file by this attribute.
    assert!(a.windows(19).any(|w| w == b"BlenderMultiChannel"));
    assert_eq!(exr_pixels(&a), exr_pixels(MULTILAYER_A));
    let (a, _) = strip_png(RGBA16_A).unwrap();
    let (b, _) = strip_png(RGBA16_B).unwrap();
    assert_eq!(a, b);
    assert_eq!(png_pixels(&a), png_pixels(RGBA16_A));
}

/// A two-part OpenEXR file (written by the `exr` crate) whose parts carry a
/// `Date` stamp.
fn two_part_exr(date: &str) -> Vec<u8> {
    use exr::prelude::*;
    let layer = |name: &str, v: f32| {
        let mut attributes = LayerAttributes::named(name);
        attributes.other.insert(
            Text::from("Date"),
            exr::meta::attribute::AttributeValue::Text(Text::from(date)),
        );
        Layer::new(
            (4, 3),
            attributes,
            Encoding::FAST_LOSSLESS,
            AnyChannels::sort(SmallVec::from_vec(vec![AnyChannel::new(
                "Y",
                FlatSamples::F32(vec![v; 12]),
            )])),
        )
    };
    let image = Image::from_layers(
        ImageAttributes::new(IntegerBounds::from_dimensions((4, 3))),
        SmallVec::from_vec(vec![layer("left", 0.25), layer("right", 0.75)]),
    );
    let mut out = std::io::Cursor::new(Vec::new());
    image.write().to_buffered(&mut out).unwrap();
    out.into_inner()
}

#[test]
fn multipart_exr_offsets_follow_the_removed_stamps() {
    let a = two_part_exr("2026/12/03 14:02:15");
    let b = two_part_exr("2026/12/03 14:02:16 and longer");
    assert_ne!(a.len(), b.len());
    let (sa, fa) = strip_exr(&a).unwrap();
    let (sb, _) = strip_exr(&b).unwrap();
    assert_eq!(sa, sb);
    assert_eq!(keys(&fa), ["Date", "Date"]);
    use exr::prelude::*;
    let read = |bytes: &[u8]| {
        let image = read()
            .no_deep_data()
            .largest_resolution_level()
            .all_channels()
            .all_layers()
            .all_attributes()
            .from_buffered(std::io::Cursor::new(bytes.to_vec()))
            .unwrap();
        image
            .layer_data
            .iter()
            .map(|l| {
                l.channel_data.list[0]
                    .sample_data
                    .values_as_f32()
                    .collect::<Vec<f32>>()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(read(&sa), read(&a));
    assert_eq!(read(&sa), [vec![0.25; 12], vec![0.75; 12]]);
}
