//! Blender's volatile metadata in PNG and OpenEXR files, taken out so that the
//! same task rendered twice gives the same bytes, and read into the frame's
//! render statistics on the way.
//!
//! Blender stamps every image it saves (measured with Blender 3.4.1, CPU
//! Cycles, two renders of one 64x48 frame): PNG `tEXt` chunks and OpenEXR
//! `string` header attributes named `File` (the scene's path, so it differs
//! between workers' caches), `Date`, `RenderTime`, `cycles.<view layer>.total_time`,
//! `.render_time`, `.synchronization_time` and `.samples`, plus `Memory` and
//! `Hostname` when the scene asks for them. Two renders differed in exactly
//! those; `Frame`, `Camera`, `Scene` and `Time` (the frame's timecode) were
//! equal.
//!
//! The rule is an allowlist: every text field is removed except
//! [`KEPT_KEYS`], which derive from the scene and frame alone, so a stamp this
//! module does not know (a later Blender's) cannot make two renders differ.
//!
//! PNG: the text chunks (`tEXt`, `zTXt`, `iTXt`) and `tIME` are dropped whole;
//! nothing in a PNG points at byte offsets, so the rest stays as it was.
//!
//! OpenEXR: the attributes are *removed* from the header and the chunk offset
//! table that follows it (absolute file offsets, 8 bytes each) is shifted by
//! the bytes removed. Zeroing values in place is not enough: `File` holds the
//! scene's path in the worker's cache, whose length differs between workers,
//! so the header's size (and every offset after it) would still differ.
//! The table's length is found from the table itself: OpenEXR writers put the
//! first chunk right after the table, so the table ends where its smallest
//! offset points. Single-part and multi-part files are handled alike (their
//! tables are contiguous).

use std::path::Path;

/// Text fields that derive from the scene and frame alone: kept.
pub const KEPT_KEYS: &[&str] = &[
    "Frame",
    "FrameRange",
    "Camera",
    "Lens",
    "Scene",
    "Marker",
    "Note",
    "Time",
];

/// OpenEXR's own string attributes, and Blender's marker of a multilayer
/// file (which its reader looks for): not stamps, kept.
const EXR_STANDARD: &[&str] = &[
    "BlenderMultiChannel",
    "name",
    "type",
    "view",
    "owner",
    "comments",
    "renderingTransform",
    "lookModTransform",
    "wrapmodes",
];

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";
const EXR_MAGIC: &[u8] = &[0x76, 0x2f, 0x31, 0x01];

/// Why a file's metadata could not be edited.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read the image's metadata: {0}")]
pub struct MetaError(String);

fn bad(what: impl Into<String>) -> MetaError {
    MetaError(what.into())
}

/// Text fields taken out of an image: (key, value).
pub type Fields = Vec<(String, String)>;

/// What Blender said about one render, read from its stamps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderStats {
    /// Wall time of the render (`RenderTime`), ms.
    pub render_ms: Option<u64>,
    /// Cycles' scene synchronisation time, ms.
    pub sync_ms: Option<u64>,
    /// Samples per pixel Cycles rendered.
    pub samples: Option<u32>,
    /// Peak memory (`Memory`, only when the scene stamps it), bytes.
    pub memory_peak_bytes: Option<u64>,
}

/// Removes the volatile text chunks of a PNG; returns the new file and the
/// fields removed. `zTXt` and compressed `iTXt` values are reported empty
/// (Blender writes plain `tEXt`).
pub fn strip_png(bytes: &[u8]) -> Result<(Vec<u8>, Fields), MetaError> {
    if !bytes.starts_with(PNG_MAGIC) {
        return Err(bad("not a PNG file"));
    }
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(PNG_MAGIC);
    let mut fields = Vec::new();
    let mut at = PNG_MAGIC.len();
    let mut ended = false;
    while at < bytes.len() {
        let header = bytes
            .get(at..at + 8)
            .ok_or_else(|| bad("PNG chunk header cut short"))?;
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let kind = &header[4..8];
        let end = at
            .checked_add(12)
            .and_then(|n| n.checked_add(len))
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| bad("PNG chunk runs past the end of the file"))?;
        let data = &bytes[at + 8..at + 8 + len];
        let text = matches!(kind, b"tEXt" | b"zTXt" | b"iTXt");
        let key = text.then(|| png_key(data));
        match key {
            Some(key) if !KEPT_KEYS.contains(&key.as_str()) => {
                let value = if kind == b"tEXt" {
                    latin1(&data[key.len() + 1..])
                } else if kind == b"iTXt" {
                    itxt_plain_value(data, key.len()).unwrap_or_default()
                } else {
                    String::new()
                };
                fields.push((key, value));
            }
            _ if kind == b"tIME" => {}
            _ => out.extend_from_slice(&bytes[at..end]),
        }
        at = end;
        if kind == b"IEND" {
            ended = true;
            break;
        }
    }
    if !ended {
        return Err(bad("PNG without an IEND chunk"));
    }
    Ok((out, fields))
}

/// The keyword of a text chunk (bytes up to the first NUL, at most 79).
fn png_key(data: &[u8]) -> String {
    let n = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    latin1(&data[..n.min(79)])
}

fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| char::from(c)).collect()
}

/// An uncompressed `iTXt` value: keyword, NUL, flag, method, language, NUL,
/// translated keyword, NUL, text.
fn itxt_plain_value(data: &[u8], key_len: usize) -> Option<String> {
    let rest = data.get(key_len + 1..)?;
    if *rest.first()? != 0 {
        return None;
    }
    let rest = rest.get(2..)?;
    let lang_end = rest.iter().position(|&b| b == 0)?;
    let rest = rest.get(lang_end + 1..)?;
    let tk_end = rest.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(rest.get(tk_end + 1..)?).into_owned())
}

/// Removes the volatile string attributes of an OpenEXR file's header(s) and
/// shifts its chunk offset table to match; returns the new file and the
/// fields removed.
pub fn strip_exr(bytes: &[u8]) -> Result<(Vec<u8>, Fields), MetaError> {
    if !bytes.starts_with(EXR_MAGIC) || bytes.len() < 8 {
        return Err(bad("not an OpenEXR file"));
    }
    let flags = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let multipart = flags & 0x1000 != 0;
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&bytes[..8]);
    let mut fields = Vec::new();
    let mut at = 8;
    loop {
        // One header: attributes until an empty name.
        let mut attributes = 0;
        loop {
            let name = c_string(bytes, at)?;
            if name.is_empty() {
                out.push(0);
                at += 1;
                break;
            }
            let type_at = at + name.len() + 1;
            let kind = c_string(bytes, type_at)?;
            let size_at = type_at + kind.len() + 1;
            let size = bytes
                .get(size_at..size_at + 4)
                .ok_or_else(|| bad("OpenEXR attribute cut short"))?;
            let size = i32::from_le_bytes([size[0], size[1], size[2], size[3]]);
            let size = usize::try_from(size).map_err(|_| bad("negative attribute size"))?;
            let end = (size_at + 4)
                .checked_add(size)
                .filter(|&e| e <= bytes.len())
                .ok_or_else(|| bad("OpenEXR attribute runs past the end of the file"))?;
            let stamp = kind == "string"
                && !KEPT_KEYS.contains(&name.as_str())
                && !EXR_STANDARD.contains(&name.as_str());
            if stamp {
                fields.push((name, latin1(&bytes[size_at + 4..end])));
            } else {
                out.extend_from_slice(&bytes[at..end]);
            }
            attributes += 1;
            at = end;
        }
        // A multi-part file ends its list of headers with an empty header.
        if !multipart || attributes == 0 {
            break;
        }
        if bytes.get(at) == Some(&0) {
            out.push(0);
            at += 1;
            break;
        }
    }
    let removed = (at - out.len()) as u64;
    let table = offset_table_len(bytes, at)?;
    for i in 0..table {
        let p = at + i * 8;
        let offset = u64::from_le_bytes(bytes[p..p + 8].try_into().expect("8 bytes"));
        out.extend_from_slice(&(offset - removed).to_le_bytes());
    }
    out.extend_from_slice(&bytes[at + table * 8..]);
    Ok((out, fields))
}

/// The number of entries of the offset table at `start`: the table ends
/// where its smallest offset points (the first chunk follows it).
fn offset_table_len(bytes: &[u8], start: usize) -> Result<usize, MetaError> {
    let mut least = u64::MAX;
    let mut n = 0;
    loop {
        let p = start + n * 8;
        let entry = bytes
            .get(p..p + 8)
            .ok_or_else(|| bad("OpenEXR offset table runs past the end of the file"))?;
        let offset = u64::from_le_bytes(entry.try_into().expect("8 bytes"));
        if offset < (p + 8) as u64 || offset >= bytes.len() as u64 {
            return Err(bad(format!(
                "OpenEXR offset table entry {n} points at {offset}, outside the chunks (an incomplete file?)"
            )));
        }
        least = least.min(offset);
        n += 1;
        if (start + n * 8) as u64 == least {
            return Ok(n);
        }
    }
}

/// The NUL-terminated string at `at` (attribute names and types are short).
fn c_string(bytes: &[u8], at: usize) -> Result<String, MetaError> {
    let rest = bytes
        .get(at..)
        .ok_or_else(|| bad("OpenEXR header cut short"))?;
    let n = rest
        .iter()
        .take(256)
        .position(|&b| b == 0)
        .ok_or_else(|| bad("OpenEXR attribute name without its end"))?;
    Ok(latin1(&rest[..n]))
}

/// Strips the stamps of a PNG or OpenEXR file by its first bytes; other
/// files are left as they are (no fields).
pub fn strip(bytes: &[u8]) -> Result<Option<(Vec<u8>, Fields)>, MetaError> {
    if bytes.starts_with(PNG_MAGIC) {
        strip_png(bytes).map(Some)
    } else if bytes.starts_with(EXR_MAGIC) {
        strip_exr(bytes).map(Some)
    } else {
        Ok(None)
    }
}

/// Strips the stamps of the image at `path` in place (written to a
/// temporary file and renamed); returns the fields removed.
pub fn strip_file(path: &Path) -> Result<Fields, MetaError> {
    let io = |e: std::io::Error| bad(format!("{}: {e}", path.display()));
    let bytes = std::fs::read(path).map_err(io)?;
    let Some((stripped, fields)) = strip(&bytes)? else {
        return Ok(Vec::new());
    };
    if stripped != bytes {
        let tmp = path.with_extension("stripping");
        std::fs::write(&tmp, &stripped).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
    }
    Ok(fields)
}

/// Reads render statistics from stamps: `RenderTime` (or Cycles'
/// `total_time`), `synchronization_time`, `samples` and `Memory`.
pub fn stats(fields: &[(String, String)]) -> RenderStats {
    let get = |want: &dyn Fn(&str) -> bool| {
        fields
            .iter()
            .find(|(k, _)| want(k))
            .map(|(_, v)| v.as_str())
    };
    let cycles =
        |suffix: &'static str| move |k: &str| k.starts_with("cycles.") && k.ends_with(suffix);
    RenderStats {
        render_ms: get(&|k| k == "RenderTime")
            .or_else(|| get(&cycles(".total_time")))
            .and_then(duration_ms),
        sync_ms: get(&cycles(".synchronization_time")).and_then(duration_ms),
        samples: get(&cycles(".samples")).and_then(|v| v.trim().parse().ok()),
        memory_peak_bytes: get(&|k| k == "Memory").and_then(memory_bytes),
    }
}

/// Blender's durations: `SS.hh`, `MM:SS.hh` or `HH:MM:SS.hh`.
pub fn duration_ms(s: &str) -> Option<u64> {
    let mut total = 0.0;
    for part in s.trim().split(':') {
        let v: f64 = part.trim().parse().ok()?;
        if !v.is_finite() || v < 0.0 {
            return None;
        }
        total = total * 60.0 + v;
    }
    Some((total * 1000.0).round() as u64)
}

/// Blender's memory stamp: `1.12M` (MiB), also `K` and `G`; a peak after
/// `Peak ` when a line holds two.
pub fn memory_bytes(s: &str) -> Option<u64> {
    let s = s
        .rsplit("Peak")
        .next()?
        .trim()
        .trim_start_matches(':')
        .trim();
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let v: f64 = num.trim().parse().ok()?;
    let scale = match unit.chars().next()? {
        'K' | 'k' => 1024.0,
        'M' => 1024.0 * 1024.0,
        'G' => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    (v.is_finite() && v >= 0.0).then(|| (v * scale).round() as u64)
}

#[cfg(test)]
mod tests;
