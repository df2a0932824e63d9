//! The behaviour every [`BlobStore`] must have, as one test function run
//! against each implementation: the file and memory stores in this crate's
//! unit tests, the S3 store against a real S3 server in `tests/tests/s3.rs`.
//! Compiled for tests only (this crate's, or with the `contract-tests` feature).

use super::{BlobStore, BlobWriter};
use crate::digest::Digest;
use crate::error::Error;

/// Size of the large blob: over two 8 MiB parts of a multipart upload, and
/// not a multiple of any chunk size.
pub const LARGE: usize = 20 * (1 << 20) + 12_345;
/// The uploads' chunk size, as the gRPC handler streams them.
const CHUNK: usize = 1 << 20;

/// Bytes that differ from position to position (and by `seed`).
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn stream(w: &mut Box<dyn BlobWriter>, bytes: &[u8]) -> Result<(), Error> {
    for chunk in bytes.chunks(CHUNK) {
        w.write(chunk)?;
    }
    Ok(())
}

/// Runs the whole contract against `store`, whose upload limit must be at
/// least [`LARGE`] bytes and which must start empty of the blobs used here.
/// Returns the digests it leaves stored, so the caller can check that
/// nothing else is visible in the store.
pub fn check(store: &dyn BlobStore) -> Vec<Digest> {
    let mut kept = Vec::new();

    // Put, read, range, size; the same bytes twice are stored once.
    let small = pattern(1000, 1);
    let d = Digest::of(&small);
    assert!(!store.contains(&d));
    assert_eq!(store.size(&d), None);
    assert!(!store.put(d, &small).unwrap(), "a new blob");
    assert!(store.put(d, &small).unwrap(), "already present");
    assert!(store.contains(&d));
    assert_eq!(store.size(&d), Some(1000));
    assert_eq!(store.read(&d).unwrap(), small);
    assert_eq!(store.read_range(&d, 10, 20).unwrap(), &small[10..30]);
    assert_eq!(store.read_range(&d, 990, 100).unwrap(), &small[990..]);
    assert!(store.read_range(&d, 1000, 10).unwrap().is_empty());
    assert!(store.read_range(&d, 5000, 10).unwrap().is_empty());
    kept.push(d);

    // An empty blob.
    let empty = Digest::of(b"");
    assert!(!store.put(empty, b"").unwrap());
    assert_eq!(store.size(&empty), Some(0));
    assert!(store.read(&empty).unwrap().is_empty());
    kept.push(empty);

    // A digest mismatch is refused and leaves nothing.
    let claimed = Digest::of(b"one");
    let err = store.put(claimed, b"two").unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
    assert!(!store.contains(&claimed));

    // More bytes than declared fail (on a write or at the commit).
    let over = pattern(100, 2);
    let d_over = Digest::of(&over);
    let mut w = store.writer(d_over, 50).unwrap();
    let failed = w.write(&over).is_err() || w.commit().is_err();
    assert!(failed, "an upload over its declared size must fail");
    assert!(!store.contains(&d_over));

    // A writer dropped partway leaves nothing, small or large.
    let half = pattern(1000, 3);
    let mut w = store.writer(Digest::of(&half), 1000).unwrap();
    w.write(&half[..500]).unwrap();
    drop(w);
    assert!(!store.contains(&Digest::of(&half)));
    let big = pattern(LARGE, 4);
    let d_big = Digest::of(&big);
    let mut w = store.writer(d_big, LARGE as u64).unwrap();
    stream(&mut w, &big[..LARGE / 2]).unwrap();
    drop(w);
    assert!(
        !store.contains(&d_big),
        "a dropped large upload left a blob"
    );

    // A large upload whose bytes do not match its digest leaves nothing.
    let other = pattern(LARGE, 5);
    let mut w = store.writer(d_big, LARGE as u64).unwrap();
    stream(&mut w, &other).unwrap();
    let err = w.commit().unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
    assert!(!store.contains(&d_big));

    // A large blob round-trips, whole and in ranges across part boundaries.
    let mut w = store.writer(d_big, LARGE as u64).unwrap();
    stream(&mut w, &big).unwrap();
    assert!(!w.commit().unwrap());
    assert_eq!(store.size(&d_big), Some(LARGE as u64));
    let back = store.read(&d_big).unwrap();
    assert!(back == big, "the large blob came back different");
    for offset in [0, (8 << 20) - 7, (16 << 20) - 1, LARGE - 10] {
        assert_eq!(
            store.read_range(&d_big, offset as u64, 100).unwrap(),
            &big[offset..(offset + 100).min(LARGE)],
            "range at {offset}"
        );
    }
    // Again: already present, nothing sent.
    let mut w = store.writer(d_big, LARGE as u64).unwrap();
    stream(&mut w, &big).unwrap();
    assert!(w.commit().unwrap());
    kept.push(d_big);

    // Remove: gone, reads say not found, removing again is no error.
    let gone = pattern(10, 6);
    let d_gone = Digest::of(&gone);
    store.put(d_gone, &gone).unwrap();
    store.remove(&d_gone).unwrap();
    assert!(!store.contains(&d_gone));
    assert!(matches!(store.read(&d_gone), Err(Error::NotFound(_))));
    store.remove(&d_gone).unwrap();

    // Made durable: every kept blob reads back the same; a blob removed
    // after that is gone too.
    store.put(d_gone, &gone).unwrap();
    store.make_durable().unwrap();
    assert_eq!(store.read(&d).unwrap(), small);
    assert_eq!(store.size(&d_big), Some(LARGE as u64));
    assert!(store.read(&d_big).unwrap() == big, "the large blob changed");
    assert!(store.read(&empty).unwrap().is_empty());
    store.remove(&d_gone).unwrap();
    assert!(!store.contains(&d_gone));
    store.make_durable().unwrap();

    kept
}
