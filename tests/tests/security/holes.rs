//! The corpus cases of issue 21, "holes a hostile user found": file sets
//! whose shared paths leave the share, that repeat one file to fill a
//! worker's disk, or that no worker can make; bundles and hashes that trust
//! a cache; a token on the command line.

use super::lanes::refused;
use super::*;

/// File sets that must be refused at submit, straight to the port, each
/// naming the entry at fault. Returns the number of cases.
pub fn file_sets(
    rt: &tokio::runtime::Runtime,
    url: &str,
    scene_bytes: &[u8],
    alice: &str,
) -> usize {
    let scene = blake3::hash(scene_bytes).to_hex().to_string();
    let entry = |path: &str| pb::FileEntry {
        path: path.into(),
        digest: scene.clone(),
        size: scene_bytes.len() as u64,
        mode: 0o644,
        shared: String::new(),
    };
    let shared = |path: &str, at: &str| pb::FileEntry {
        path: path.into(),
        digest: String::new(),
        size: 1,
        mode: 0o644,
        shared: at.into(),
    };
    let long = format!("tex/{}.png", "n".repeat(300));
    let mut repeated = vec![entry("s.blend")];
    repeated.extend((0..10_000).map(|i| entry(&format!("t/{i}.blend"))));
    let cases: Vec<(Vec<pb::FileEntry>, String)> = vec![
        (
            // The probe that linked /etc/hostname into a job root.
            vec![entry("s.blend"), shared("h.png", "/mnt/projects//etc/hostname")],
            "`h.png` in the file set is on shared storage at `/mnt/projects//etc/hostname`, which is not a normalised absolute path".into(),
        ),
        (
            vec![entry("s.blend"), shared("p.png", "/mnt/projects/../../etc/passwd")],
            "`p.png` in the file set is on shared storage".into(),
        ),
        (
            // 10,001 copies of one file: a 6 MB set that built a 491 MB root.
            repeated,
            format!("{} times, over the limit of 10000 copies of one file", 10_001),
        ),
        (
            vec![entry("s.blend"), entry("tex"), entry("tex/w.blend")],
            "`tex` in the file set is both a file and a folder".into(),
        ),
        (
            vec![entry("s.blend"), entry(&long)],
            "a name of 304 bytes, over the file-system limit of 255".into(),
        ),
    ];
    let n = cases.len();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let blobs = pb::blobs_client::BlobsClient::new(channel.clone());
        let mut farm = pb::farm_client::FarmClient::new(channel);
        for (files, want) in cases {
            let manifest = prost::Message::encode_to_vec(&pb::FileSet {
                scene: "s.blend".into(),
                files,
                ..Default::default()
            });
            let digest = blake3::hash(&manifest).to_hex().to_string();
            let chunks: Vec<pb::BlobChunk> = manifest
                .chunks(1 << 20)
                .map(|c| pb::BlobChunk {
                    digest: digest.clone(),
                    size: manifest.len() as u64,
                    data: c.to_vec(),
                })
                .collect();
            blobs
                .clone()
                .put_blob(authed(tokio_stream::iter(chunks), alice))
                .await
                .unwrap();
            let spec = pb::JobSpec {
                scene_digest: scene.clone(),
                scene_name: "s.blend".into(),
                frames: "1".into(),
                file_set_digest: digest,
                ..Default::default()
            };
            refused(
                farm.submit_job(authed(spec, alice)).await,
                tonic::Code::InvalidArgument,
                &want,
            );
        }
    });
    n
}

/// A bundle file changed by one byte with its size and mtime restored is
/// hashed again, not taken from the hash cache; a token given with
/// `--token` draws a warning. Returns the number of cases.
pub fn hashes_and_tokens(url: &str, scene: &Path, alice: &str, dir: &Path) -> usize {
    let bytes = std::fs::read(scene).unwrap();
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join("files")).unwrap();
    let file = bundle.join("files/s.blend");
    std::fs::write(&file, &bytes).unwrap();
    let manifest = serde_json::json!({
        "format": "tessera-bundle",
        "version": 1,
        "job": {"frames": "1"},
        "file_set": {"scene": "s.blend", "files": [{
            "path": "s.blend",
            "digest": blake3::hash(&bytes).to_hex().to_string(),
            "size": bytes.len(),
        }]},
    });
    std::fs::write(bundle.join("manifest.json"), manifest.to_string()).unwrap();
    // A hash cache of its own, so the first run fills the cache the second
    // would (wrongly) trust.
    let cache = dir.join("xdg-cache");
    let run = |args: &[&str]| {
        std::process::Command::new(tessera())
            .args(args)
            .env("TESSERA_COORDINATOR", url)
            .env("TESSERA_TOKEN", alice)
            .env("XDG_CACHE_HOME", &cache)
            .env("XDG_CONFIG_HOME", "/nonexistent")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let b = bundle.to_str().unwrap();
    let f = file.to_str().unwrap();
    // `tessera hash` of the bundle's own file: before the fix this filled
    // the cache that `submit --bundle` then trusted.
    let hashed = run(&["hash", f]);
    assert!(hashed.status.success(), "{}", stderr(&hashed));
    let before = String::from_utf8_lossy(&hashed.stdout).into_owned();
    assert!(
        before.contains(&blake3::hash(&bytes).to_hex().to_string()),
        "{before}"
    );

    // One byte changed at the end (past what Blender reads), mtime restored.
    let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
    let mut changed = bytes.clone();
    *changed.last_mut().unwrap() ^= 0x55;
    std::fs::write(&file, &changed).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let out = run(&["submit", "--bundle", b]);
    assert!(
        !out.status.success() && stderr(&out).contains("does not match its manifest"),
        "a changed bundle with its mtime restored: {}",
        stderr(&out)
    );
    let after = run(&["hash", f]);
    let after = String::from_utf8_lossy(&after.stdout).into_owned();
    assert!(
        after.contains(&blake3::hash(&changed).to_hex().to_string()) && after != before,
        "tessera hash reads the bytes: {before} then {after}"
    );

    // --token on the command line is visible to every process here.
    let out = std::process::Command::new(tessera())
        .args(["jobs", "--token", alice])
        .env("TESSERA_COORDINATOR", url)
        .env_remove("TESSERA_TOKEN")
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the token is on the command line"),
        "{}",
        stderr(&out)
    );
    3
}

/// `/metrics` shows per-job series to an admin, to the `metrics` role and
/// to the job's owner only; everyone sees the farm's totals. The `metrics`
/// role reads nothing else. Returns the number of cases.
pub fn metrics_per_user(coord: &Coordinator, job: u64, alice: &str, bob: &str) -> usize {
    let url = coord.metrics.clone().expect("started with --http");
    let series = format!("tessera_job_cost_total{{job=\"{job}\"}}");
    let page = |token: &str| {
        let (status, body) = http_get_as(&url, Some(token));
        assert!(status.contains("200"), "{status}: {body}");
        body
    };
    let admin = page(&coord.admin_token());
    assert!(admin.contains(&series), "the admin sees every job: {admin}");
    assert!(page(alice).contains(&series), "alice sees her own job");
    let theirs = page(bob);
    assert!(
        !theirs.contains(&format!("job=\"{job}\"")),
        "bob sees nothing of alice's job: {theirs}"
    );
    assert!(
        theirs.contains("tessera_tasks{state=\"done\"}"),
        "bob sees totals: {theirs}"
    );
    let added = cli_as(
        &coord.url,
        Some(&coord.admin_token()),
        &["users", "add", "prometheus", "--role", "metrics"],
    );
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let prometheus = String::from_utf8_lossy(&added.stdout).trim().to_string();
    assert!(
        page(&prometheus).contains(&series),
        "the metrics role sees every job's series"
    );
    let (status, body) = http_get_as(&url.replace("/metrics", "/api/v1/jobs"), Some(&prometheus));
    assert!(
        status.contains("403"),
        "the metrics role reads no jobs: {status} {body}"
    );
    let listed = cli_as(&coord.url, Some(&prometheus), &["jobs"]);
    assert!(!listed.status.success(), "nor over gRPC");
    5
}

/// A job whose client leaves out the scene's size (no `scene_info`) is
/// checked by the worker against the size Blender reads: it fails once,
/// with the size and the limit. Returns the number of cases.
pub fn pixels_from_blender(
    rt: &tokio::runtime::Runtime,
    url: &str,
    wide: &Path,
    alice: &str,
) -> usize {
    let bytes = std::fs::read(wide).unwrap();
    let digest = blake3::hash(&bytes).to_hex().to_string();
    let job = rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let chunk = pb::BlobChunk {
            digest: digest.clone(),
            size: bytes.len() as u64,
            data: bytes.clone(),
        };
        pb::blobs_client::BlobsClient::new(channel.clone())
            .put_blob(authed(tokio_stream::iter(vec![chunk]), alice))
            .await
            .unwrap();
        let spec = pb::JobSpec {
            scene_digest: digest,
            scene_name: "wide.blend".into(),
            frames: "1".into(),
            max_attempts: 3,
            ..Default::default()
        };
        pb::farm_client::FarmClient::new(channel)
            .submit_job(authed(spec, alice))
            .await
            .unwrap()
            .into_inner()
            .job_id
    });
    let st = wait_for(url, job, LONG, "the too-wide job to fail", |j| {
        j["state"] == "failed" || j["state"] == "done"
    });
    let msg = st["message"].as_str().unwrap_or_default();
    assert!(
        st["state"] == "failed"
            && msg.contains("5000x100 pixels, as Blender reads it, over the coordinator's limit of 4096x4096 (--max-pixels)"),
        "{st:#}"
    );
    1
}
