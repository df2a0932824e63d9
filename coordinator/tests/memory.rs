//! Issue 21 part 9, memory comes back: after jobs with huge file sets are
//! deleted, the coordinator's resident memory falls again.
//!
//! Its own test binary, with one test, so that no other test's allocations
//! move the process's RSS while it is measured.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prost::Message;
use tessera_coordinator::blobs::{BlobStore, BlobWriter};
use tessera_coordinator::clock::ManualClock;
use tessera_coordinator::digest::Digest;
use tessera_coordinator::farm::{Config, Farm, Submission};
use tessera_coordinator::store::MemoryStore;
use tessera_coordinator::Error;
use tessera_proto as pb;

const JOBS: u32 = 3;
const ENTRIES: u32 = 120_000;
const SCENE: &[u8] = b"BLENDER-v304 scene ... ENDB\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

/// A blob store that holds every entry of the file sets without keeping
/// their bytes (so that what is measured is the farm's memory): entries
/// exist, file-set manifests are made again on each read.
struct FakeBlobs {
    manifests: Mutex<HashMap<Digest, u32>>,
}

fn entry_digest(set: u32, i: u32) -> Digest {
    Digest::of(format!("{set}/{i}").as_bytes())
}

fn manifest(set: u32) -> Vec<u8> {
    pb::FileSet {
        scene: "s.blend".into(),
        files: std::iter::once(pb::FileEntry {
            path: "s.blend".into(),
            digest: Digest::of(SCENE).to_string(),
            size: SCENE.len() as u64,
            mode: 0o644,
            shared: String::new(),
        })
        .chain((0..ENTRIES).map(|i| pb::FileEntry {
            path: format!("tex/{i}.png"),
            digest: entry_digest(set, i).to_string(),
            size: 1,
            mode: 0o644,
            shared: String::new(),
        }))
        .collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

impl FakeBlobs {
    fn bytes(&self, d: &Digest) -> Result<Vec<u8>, Error> {
        if *d == Digest::of(SCENE) {
            return Ok(SCENE.to_vec());
        }
        match self.manifests.lock().unwrap().get(d) {
            Some(set) => Ok(manifest(*set)),
            None => Ok(vec![0]),
        }
    }
}

impl BlobStore for FakeBlobs {
    fn contains(&self, _: &Digest) -> bool {
        true
    }
    fn size(&self, d: &Digest) -> Option<u64> {
        self.bytes(d).ok().map(|b| b.len() as u64)
    }
    fn writer(&self, _: Digest, _: u64) -> Result<Box<dyn BlobWriter>, Error> {
        Err(Error::invalid("no uploads in this test"))
    }
    fn read(&self, d: &Digest) -> Result<Vec<u8>, Error> {
        self.bytes(d)
    }
    fn read_range(&self, d: &Digest, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        let b = self.bytes(d)?;
        let start = (offset as usize).min(b.len());
        Ok(b[start..(start + len).min(b.len())].to_vec())
    }
    fn remove(&self, _: &Digest) -> Result<(), Error> {
        Ok(())
    }
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn deleting_jobs_with_huge_file_sets_gives_their_memory_back() {
    let clock = Arc::new(ManualClock::at(1_000_000));
    let blobs = Arc::new(FakeBlobs {
        manifests: Mutex::new(HashMap::new()),
    });
    let config = Config {
        auth: false,
        ..Config::default()
    };
    let farm = Farm::open(
        Arc::new(MemoryStore::default()),
        blobs.clone(),
        clock.clone(),
        config,
    )
    .unwrap();
    let before = rss();
    let mut jobs = Vec::new();
    for set in 0..JOBS {
        let d = Digest::of(&manifest(set));
        blobs.manifests.lock().unwrap().insert(d, set);
        let sub = Submission {
            after: Vec::new(),
            max_cost: None,
            capacity: Default::default(),
            scene: Digest::of(SCENE),
            scene_name: "s.blend".into(),
            frames: "1".into(),
            chunk: 1,
            priority: 0,
            max_attempts: 0,
            tiles: String::new(),
            overscan: None,
            scene_info: None,
            device: String::new(),
            min_vram_gb: 0.0,
            tags: Vec::new(),
            owner: "alice".into(),
            file_set: Some(d),
            features: Vec::new(),
            blender: String::new(),
            preview: false,
            verify: 0.0,
        };
        jobs.push(farm.submit(sub).unwrap());
    }
    let peak = rss();
    for id in jobs {
        farm.cancel(id).unwrap();
        farm.delete(id).unwrap();
    }
    // The entries become garbage; the collector takes them after the grace.
    clock.advance(10 * farm.config().blob_grace_ms);
    while farm.collect_garbage() > 0 {}
    farm.collect_garbage();
    let after = rss();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "RSS: {:.1} MiB before, {:.1} MiB with {JOBS} jobs of {ENTRIES} files, {:.1} MiB after deleting them",
        mib(before),
        mib(peak),
        mib(after)
    );
    let grown = peak.saturating_sub(before);
    assert!(
        grown > 20 << 20,
        "the jobs took only {:.1} MiB: the test measures nothing",
        mib(grown)
    );
    assert!(
        after.saturating_sub(before) < grown / 3,
        "deleting the jobs gave back too little: {:.1} MiB before, {:.1} MiB at the peak, {:.1} MiB after",
        mib(before),
        mib(peak),
        mib(after)
    );
}
