//! `blendfile::sniff` on arbitrary bytes: it never panics, and it accepts
//! exactly the documented headers. `blendfile::check_end` on the same bytes,
//! split into a head and a tail, never panics either.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_coordinator::blendfile::{check_end, sniff, BlendKind, NotBlend, TAIL};

fuzz_target!(|data: &[u8]| {
    let result = sniff(data);
    match result {
        Ok(BlendKind::Gzip) => {
            assert!(data.len() >= 12 && data.starts_with(&[0x1f, 0x8b]));
        }
        Ok(BlendKind::Zstd) => {
            assert!(data.len() >= 12 && data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]));
        }
        Ok(BlendKind::Plain) => {
            // `BLENDER`, pointer size `_`/`-`, endianness `v`/`V`, 3-digit version.
            assert!(data.len() >= 12);
            assert_eq!(&data[..7], b"BLENDER");
            assert!(matches!(data[7], b'_' | b'-'));
            assert!(matches!(data[8], b'v' | b'V'));
            assert!(data[9..12].iter().all(u8::is_ascii_digit));
        }
        Err(NotBlend::TooShort(n)) => {
            assert_eq!(n, data.len());
            assert!(n < 12);
        }
        Err(NotBlend::Truncated) => panic!("sniff reported Truncated; only check_end may"),
        Err(NotBlend::BadHeader) => {
            // Refused, so it must not carry any documented header.
            assert!(data.len() >= 12);
            assert!(!data.starts_with(&[0x1f, 0x8b]));
            assert!(!data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]));
            assert!(
                !(data.starts_with(b"BLENDER")
                    && matches!(data[7], b'_' | b'-')
                    && matches!(data[8], b'v' | b'V')
                    && data[9..12].iter().all(u8::is_ascii_digit))
            );
        }
    }
    // Only the first 12 bytes decide: whatever follows them changes nothing.
    if data.len() > 12 {
        assert_eq!(sniff(&data[..12]), result);
    }
    // The messages render (they are shown to users).
    if let Err(e) = result {
        assert!(!e.to_string().is_empty());
    }

    // The first byte splits the rest into a head and a file end.
    if let Some((&cut, rest)) = data.split_first() {
        let (head, end) = rest.split_at(usize::from(cut).min(rest.len()));
        let tail = &end[end.len().saturating_sub(TAIL)..];
        match check_end(head, tail) {
            Ok(()) => {}
            Err(NotBlend::Truncated) => assert_eq!(sniff(head), Ok(BlendKind::Plain)),
            Err(e) => assert_eq!(sniff(head), Err(e)),
        }
    }
});
