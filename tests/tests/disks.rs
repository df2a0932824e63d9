//! Full disks end to end: the coordinator's --data volume and a worker's
//! cache filled up on a small tmpfs, with real processes and Blender.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tessera_tests::tmpfs::Tmpfs;
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(120);

/// Every blob is whole: its bytes hash to its name, and no temporary file is left.
fn assert_blob_store_whole(blobs: &Path) -> usize {
    let mut n = 0;
    for dir in std::fs::read_dir(blobs).unwrap().map(|e| e.unwrap()) {
        let name = dir.file_name().to_string_lossy().into_owned();
        if name == "tmp" {
            let partial = partial_blob_files(blobs);
            assert!(
                partial.is_empty(),
                "partial files in blobs/tmp: {partial:?}"
            );
            continue;
        }
        for f in std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap()) {
            let digest = blake3::hash(&std::fs::read(f.path()).unwrap())
                .to_hex()
                .to_string();
            assert_eq!(
                digest,
                format!("{name}{}", f.file_name().to_string_lossy()),
                "a blob is not what its name says: {:?}",
                f.path()
            );
            n += 1;
        }
    }
    n
}

/// Fetches `job` into `dir/NAME` and returns its files' bytes by name.
fn fetch_bytes(url: &str, job: u64, dir: &Path, name: &str) -> BTreeMap<String, Vec<u8>> {
    let out = dir.join(name);
    cli_ok(
        url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
    frames_of(&out)
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(out.join(&f)).unwrap();
            (f, bytes)
        })
        .collect()
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The coordinator's --data fills up: submits and results are refused
/// saying where and what to do, nothing is half-written, the coordinator
/// stays up and serves what it has; once space is freed the farm goes on,
/// and after a restart every acknowledged frame is there, byte for byte.
#[test]
fn a_full_data_volume_refuses_work_until_freed_and_loses_nothing() {
    let dir = scratch();
    let data = dir.path().join("data");
    let Some(disk) = Tmpfs::mount_or_skip("full --data", &data, 96) else {
        return;
    };
    let slow = scene(&[
        "--kind",
        "anim",
        "--width",
        "96",
        "--height",
        "72",
        "--samples",
        "96",
        "--frames",
        "6",
    ]);
    let other = tessera_tests::scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "8",
        "--frames",
        "2",
    ]);
    let args = ["--min-free-mib", "4", "--lease-ttl", "3"];
    let mut coord = Coordinator::start(&data, "127.0.0.1:0", &args);
    let (addr, url) = (coord.addr.clone(), coord.url.clone());
    let worker = worker(&url, dir.path(), "w");
    let first = submit(&url, &slow, &["--frames", "1-2"]);
    wait_for(&url, first, LONG, "the first job", |j| j["state"] == "done");
    let acknowledged = fetch_bytes(&url, first, dir.path(), "first");
    assert_eq!(acknowledged.len(), 2);

    // The same frames again: their bytes are stored already, so only the
    // result's record is left to write when the disk fills mid-render.
    let again = submit(&url, &slow, &["--frames", "1-2"]);
    wait_for(
        &url,
        again,
        LONG,
        "a task of the second job to be leased",
        |j| {
            j["tasks"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["state"] == "leased"))
        },
    );
    let filler = disk.fill("filler");
    let free = disk.free();
    assert!(free < 1 << 20, "the disk is full: {free} bytes free");

    // A new scene cannot be stored.
    let refused = cli(&url, &["submit", other.to_str().unwrap(), "--frames", "1"]);
    let text = stderr_of(&refused);
    assert!(!refused.status.success());
    let named = format!("no space left on --data ({})", data.display());
    assert!(text.contains(&named), "{text}");
    assert!(text.contains("free space"), "{text}");
    // Nor a job of a scene it holds: its record cannot be written.
    let refused = cli(&url, &["submit", slow.to_str().unwrap(), "--frames", "3"]);
    let text = stderr_of(&refused);
    assert!(!refused.status.success());
    assert!(text.contains(&named), "{text}");
    // The rendered result is refused too: the worker says why and holds it.
    assert!(
        eventually(LONG, || worker.log().contains("no space left on --data")),
        "the worker never heard why its result was refused:\n{}",
        worker.log()
    );
    assert_eq!(status(&url, again)["frames_done"], 0);
    // Up, serving what it has; nothing half-written.
    let jobs: serde_json::Value = serde_json::from_str(&cli_ok(&url, &["jobs", "--json"])).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 2, "{jobs:#}");
    assert_eq!(
        fetch_bytes(&url, first, dir.path(), "while-full"),
        acknowledged
    );
    assert_blob_store_whole(&data.join("blobs"));

    // Freed, the farm goes on: the held result is taken, new work too.
    std::fs::remove_file(&filler).unwrap();
    let done = wait_for(&url, again, LONG, "the second job", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    let later = submit(&url, &other, &["--frames", "1-2"]);
    let done = wait_for(&url, later, LONG, "the third job", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    fetch_exact(&url, later, &other, 1..=2, dir.path());
    let second = fetch_bytes(&url, again, dir.path(), "second");
    assert_eq!(second, acknowledged, "the same frames, the same bytes");
    let third = fetch_bytes(&url, later, dir.path(), "third");

    // Restarted on the same --data: everything acknowledged is there.
    coord.proc.kill9();
    coord = Coordinator::start(&data, &addr, &args);
    assert_eq!(coord.url, url);
    assert_eq!(
        fetch_bytes(&url, first, dir.path(), "first-after"),
        acknowledged
    );
    assert_eq!(fetch_bytes(&url, again, dir.path(), "second-after"), second);
    assert_eq!(fetch_bytes(&url, later, dir.path(), "third-after"), third);
    assert!(assert_blob_store_whole(&data.join("blobs")) >= 5);
    drop(worker);
    drop(coord);
}

/// The scenes in a worker's cache: every file is a whole scene whose bytes
/// hash to its name (nothing half-written, no temporary file); returns
/// their digests.
fn assert_scene_cache_whole(cache: &Path) -> Vec<String> {
    let mut digests = Vec::new();
    for e in std::fs::read_dir(cache.join("scenes")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let digest = name
            .strip_suffix(".blend")
            .unwrap_or_else(|| panic!("a stray file in the scene cache: {name}"));
        let bytes = std::fs::read(e.path()).unwrap();
        assert_eq!(
            blake3::hash(&bytes).to_hex().as_str(),
            digest,
            "a broken scene in the cache: {name}"
        );
        digests.push(digest.to_string());
    }
    let tmp: Vec<_> = std::fs::read_dir(cache.join("tmp")).unwrap().collect();
    assert!(tmp.is_empty(), "partial files in the cache's tmp: {tmp:?}");
    digests
}

/// A worker's cache on a small tmpfs: a scene that does not fit evicts the
/// scenes no task uses; when even that is not enough the worker gives the
/// task back, uncharged, saying why (in `status` and its log), takes no
/// work until there is room, and leaves nothing half-written; once space
/// is freed it goes on and the job finishes exact.
#[test]
fn a_full_worker_cache_evicts_then_refuses_saying_why_and_goes_on_when_freed() {
    let dir = scratch();
    let cache = dir.path().join("cache-w");
    let Some(disk) = Tmpfs::mount_or_skip("full worker cache", &cache, 24) else {
        return;
    };
    let small = |samples: &str| {
        scene(&[
            "--kind",
            "anim",
            "--width",
            "64",
            "--height",
            "48",
            "--samples",
            samples,
            "--frames",
            "2",
        ])
    };
    let (a, b, c) = (small("8"), small("9"), small("10"));
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    let (sa, sb) = (size(&a), size(&b));
    let digest = |p: &Path| {
        blake3::hash(&std::fs::read(p).unwrap())
            .to_hex()
            .to_string()
    };
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--lease-ttl", "3"],
    );
    let url = coord.url.clone();
    let worker = worker(&url, dir.path(), "w");

    let job_a = submit(&url, &a, &["--frames", "1-2"]);
    wait_for(&url, job_a, LONG, "job A", |j| j["state"] == "done");
    assert_eq!(assert_scene_cache_whole(&cache), vec![digest(&a)]);

    // Room for B only once A, which no task uses any more, is evicted.
    const MARGIN: u64 = 1 << 20;
    let target = sb + MARGIN - sa / 2;
    let free = disk.free();
    assert!(free > target, "{free} bytes free on a 24 MiB tmpfs");
    std::fs::write(cache.join("filler"), vec![7u8; (free - target) as usize]).unwrap();
    let job_b = submit(&url, &b, &["--frames", "1-2"]);
    wait_for(&url, job_b, LONG, "job B", |j| j["state"] == "done");
    assert!(
        worker.log().contains("evicted a cached scene no task uses"),
        "{}",
        worker.log()
    );
    assert_eq!(assert_scene_cache_whole(&cache), vec![digest(&b)]);

    // No room at all: C is refused, saying why, and nothing is charged.
    disk.fill("filler2");
    let job_c = submit(&url, &c, &["--frames", "1-2"]);
    let words = "no space in this worker's cache";
    let refused = wait_for(&url, job_c, LONG, "the refusal", |j| {
        j["warnings"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w.as_str().unwrap().contains(words)))
    });
    let text = cli_ok(&url, &["status", &job_c.to_string()]);
    assert!(
        text.contains(words) && text.contains("worker w") && text.contains("free space there"),
        "{text}"
    );
    assert!(
        eventually(Duration::from_secs(10), || worker
            .log()
            .contains("taking no work until there is room")),
        "{}",
        worker.log()
    );
    // It stays refused without charging attempts or failing the job.
    std::thread::sleep(Duration::from_secs(4));
    let waiting = status(&url, job_c);
    assert_eq!(waiting["tasks_failed"], 0, "{waiting:#}");
    assert_eq!(waiting["tasks_done"], 0, "{waiting:#}");
    assert!(
        waiting["state"] == "queued" || waiting["state"] == "running",
        "{waiting:#}"
    );
    assert!(
        waiting["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["attempt_log"]
                .as_array()
                .is_none_or(|l| l.iter().all(|a| a["end"] != "failed"))),
        "{waiting:#}"
    );
    assert_eq!(assert_scene_cache_whole(&cache), vec![digest(&b)]);
    let refusals = worker.log().matches("giving the task back").count();

    // Freed: it goes on, and the job finishes exact.
    std::fs::remove_file(cache.join("filler")).unwrap();
    std::fs::remove_file(cache.join("filler2")).unwrap();
    let freed = std::time::Instant::now();
    let done = wait_for(&url, job_c, LONG, "job C", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    let after = freed.elapsed();
    fetch_exact(&url, job_c, &c, 1..=2, dir.path());
    assert_scene_cache_whole(&cache);
    eprintln!(
        "full worker cache: scenes of {sa} and {sb} bytes; the second evicted the first; \
         refused {refusals} time(s) while full ({}); job done {:.1} s after space was freed",
        refused["warnings"][0],
        after.as_secs_f64()
    );
}
