//! Recognising Blender files by their first bytes, before anything is uploaded
//! or rendered.

/// How a `.blend` file is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlendKind {
    /// Plain: `BLENDER` then pointer size, endianness and a 3-digit version.
    Plain,
    /// gzip-compressed (Blender before 3.0).
    Gzip,
    /// zstd-compressed (Blender 3.0 and later).
    Zstd,
}

/// Why bytes are not a Blender file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotBlend {
    /// Too short to hold a header.
    #[error("is empty or truncated ({0} bytes); re-save it in Blender")]
    TooShort(usize),
    /// A header that is not Blender's.
    #[error("is not a Blender file (bad header); re-save it in Blender as a .blend file")]
    BadHeader,
    /// A plain .blend without its closing `ENDB` block: cut short.
    #[error("is truncated (no ENDB block at its end); copy or save it again")]
    Truncated,
}

/// Bytes of the file's end that [`check_end`] needs.
pub const TAIL: usize = 32;

/// Checks that a plain `.blend` ends with its `ENDB` block, given the file's
/// first bytes and its last [`TAIL`] bytes (or fewer, for a tiny file).
/// Compressed files are not checked here (their end is compressed too).
pub fn check_end(head: &[u8], tail: &[u8]) -> Result<(), NotBlend> {
    if sniff(head)? != BlendKind::Plain {
        return Ok(());
    }
    // The ENDB block header is code (4), length (4), old pointer (4 or 8),
    // SDNA index (4) and count (4): 24 bytes with 8-byte pointers, 20 with 4.
    // 5.0's format has large block headers: code, SDNA index (4 each), old
    // pointer, length and count (8 each): 32 bytes.
    let header = match head[7] {
        b'-' => 24,
        b'_' => 20,
        _ => 32,
    };
    if tail.len() < header || &tail[tail.len() - header..tail.len() - header + 4] != b"ENDB" {
        return Err(NotBlend::Truncated);
    }
    Ok(())
}

/// Looks at the first bytes of a file (12 are enough) and says what it is.
pub fn sniff(head: &[u8]) -> Result<BlendKind, NotBlend> {
    if head.starts_with(&[0x1f, 0x8b]) && head.len() >= 12 {
        return Ok(BlendKind::Gzip);
    }
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) && head.len() >= 12 {
        return Ok(BlendKind::Zstd);
    }
    if head.len() < 12 {
        return Err(NotBlend::TooShort(head.len()));
    }
    // 12 bytes tell the old format; 5.0's begins `BLENDER17-`.
    if saved_by(head).is_some() || head.starts_with(b"BLENDER17-") {
        Ok(BlendKind::Plain)
    } else {
        Err(NotBlend::BadHeader)
    }
}

/// Bytes of a (decompressed) file's start that [`saved_by`] needs: the
/// 17-byte header of Blender 5.0's format, which is longer than the old one.
pub const HEADER: usize = 17;

/// The Blender version (major, minor) that saved a file, from its plain
/// (decompressed) header:
/// - `BLENDER-v405`: the format up to 4.x: pointer size, endianness, then
///   three digits (405 is 4.5);
/// - `BLENDER17-01v0500`: 5.0's: header size `17`, `-`, format version
///   `01`, endianness, then four digits (0500 is 5.0).
pub fn saved_by(head: &[u8]) -> Option<(u16, u16)> {
    let digits = |b: &[u8]| -> Option<u16> {
        b.iter().try_fold(0u16, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u16::from(c - b'0'))
        })
    };
    let rest = head.strip_prefix(b"BLENDER")?;
    let code = match rest {
        [b'_' | b'-', b'v' | b'V', d @ ..] if d.len() >= 3 => digits(&d[..3])?,
        [b'1', b'7', b'-', f1, f2, b'v' | b'V', d @ ..]
            if f1.is_ascii_digit() && f2.is_ascii_digit() && d.len() >= 4 =>
        {
            digits(&d[..4])?
        }
        _ => return None,
    };
    Some((code / 100, code % 100))
}

/// The Blender version (major, minor) that saved a file, given its first
/// bytes: plain, gzip- or zstd-compressed (a compressed file's header is
/// inside its first block, so give at least [`COMPRESSED_HEAD`] bytes).
pub fn saved_version(head: &[u8]) -> Result<(u16, u16), NotBlend> {
    use std::io::Read;
    let mut plain = [0u8; HEADER];
    let read = match sniff(head)? {
        BlendKind::Plain => {
            let n = head.len().min(HEADER);
            plain[..n].copy_from_slice(&head[..n]);
            n
        }
        BlendKind::Gzip => read_up_to(flate2::read::GzDecoder::new(head), &mut plain),
        BlendKind::Zstd => match ruzstd::decoding::StreamingDecoder::new(head) {
            Ok(mut d) => read_up_to(d.by_ref(), &mut plain),
            Err(_) => 0,
        },
    };
    saved_by(&plain[..read]).ok_or(NotBlend::BadHeader)
}

/// How much of a compressed file [`saved_version`] should be given: Blender
/// compresses in blocks of at most 128 KiB.
pub const COMPRESSED_HEAD: usize = 256 << 10;

/// Reads until `buf` is full or the reader ends or fails; returns the count.
fn read_up_to(mut r: impl std::io::Read, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        assert_eq!(sniff(b"BLENDER-v304REND"), Ok(BlendKind::Plain));
        assert_eq!(sniff(b"BLENDER_V279xxxx"), Ok(BlendKind::Plain));
        assert_eq!(
            sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0]),
            Ok(BlendKind::Zstd)
        );
        assert_eq!(
            sniff(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Ok(BlendKind::Gzip)
        );
        assert_eq!(sniff(b""), Err(NotBlend::TooShort(0)));
        assert_eq!(sniff(b"BLENDER-v3"), Err(NotBlend::TooShort(10)));
        assert_eq!(sniff(b"BLENDER-x304...."), Err(NotBlend::BadHeader));
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n0000"), Err(NotBlend::BadHeader));
        assert!(NotBlend::BadHeader
            .to_string()
            .contains("re-save it in Blender"));
    }

    #[test]
    fn the_saving_version() {
        assert_eq!(saved_by(b"BLENDER-v304REND"), Some((3, 4)));
        assert_eq!(saved_by(b"BLENDER_V279"), Some((2, 79)));
        assert_eq!(saved_by(b"BLENDER-v405"), Some((4, 5)));
        assert_eq!(saved_by(b"BLENDER17-01v0500"), Some((5, 0)));
        assert_eq!(saved_by(b"BLENDER17-01v0512"), Some((5, 12)));
        assert_eq!(saved_by(b"BLENDER17-01v05"), None);
        assert_eq!(saved_by(b"BLENDER-x304"), None);
        assert_eq!(sniff(b"BLENDER17-01v0500"), Ok(BlendKind::Plain));
        assert_eq!(saved_version(b"BLENDER17-01v0500REND"), Ok((5, 0)));
        // gzip of a 4.5 header, made with flate2's encoder.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, b"BLENDER-v405REND and more bytes").unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(saved_version(&gz), Ok((4, 5)));
        assert_eq!(saved_version(&gz[..12]), Err(NotBlend::BadHeader));
    }

    #[test]
    fn the_end_block() {
        let head = b"BLENDER-v304";
        let mut whole = b"........ENDB".to_vec();
        whole.extend_from_slice(&[0; 20]);
        assert_eq!(check_end(head, &whole[whole.len() - TAIL..]), Ok(()));
        assert_eq!(
            check_end(head, &whole[..whole.len() - 1]),
            Err(NotBlend::Truncated)
        );
        assert_eq!(check_end(head, b"ENDB"), Err(NotBlend::Truncated));
        let mut small = b"ENDB".to_vec();
        small.extend_from_slice(&[0; 16]);
        assert_eq!(check_end(b"BLENDER_v279", &small), Ok(()));
        assert_eq!(
            check_end(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0], b""),
            Ok(())
        );
    }
}
