//! Blobs in an S3-compatible bucket, against a real S3 server (SeaweedFS):
//! the blob-store contract, start-up checks that name the fix, and a farm
//! with `--blobs s3://...` end to end with real workers and Blender.

use std::time::Duration;

use tessera_coordinator::blobs::s3::S3BlobStore;
use tessera_coordinator::blobs::{contract, BlobStore};
use tessera_tests::s3::{s3_or_skip, S3Server};
use tessera_tests::*;

fn open(server: &S3Server, url: &str, extra: &[(&str, &str)]) -> Result<S3BlobStore, String> {
    let env = server.env();
    let mut settings: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    settings.extend_from_slice(extra);
    S3BlobStore::open_with(url, 64 << 20, &settings).map_err(|e| e.to_string())
}

#[test]
fn the_s3_store_keeps_the_blob_contract_and_leaves_nothing_else() {
    let Some(server) = s3_or_skip("the_s3_store_keeps_the_blob_contract") else {
        return;
    };
    let store = open(&server, &server.url("farm/blobs"), &[]).unwrap();
    let kept = contract::check(&store);
    // Only the kept blobs are visible: no probe, no part of a failed or
    // abandoned upload, nothing under a digest that did not verify.
    let mut expected: Vec<String> = kept.iter().map(|d| store.key(d)).collect();
    expected.sort();
    assert_eq!(store.keys().unwrap(), expected);
    assert!(expected.iter().all(|k| k.starts_with("farm/blobs/")));

    // Another store on the same bucket sees the same blobs (nothing is
    // kept only in memory), and a ranged read of the large one works there.
    let again = open(&server, &server.url("farm/blobs/"), &[]).unwrap();
    let large = kept.last().unwrap();
    assert_eq!(again.size(large), Some(contract::LARGE as u64));
    assert_eq!(
        again.read_range(large, 8 << 20, 16).unwrap(),
        &contract::pattern(contract::LARGE, 4)[8 << 20..(8 << 20) + 16]
    );
}

#[test]
fn a_misconfigured_s3_store_refuses_to_open_and_names_the_fix() {
    let Some(server) = s3_or_skip("a_misconfigured_s3_store_refuses_to_open") else {
        return;
    };
    let missing = open(&server, "s3://no-such-bucket/x", &[]).err().unwrap();
    assert!(
        missing.contains("\"no-such-bucket\" does not exist") && missing.contains("create it"),
        "{missing}"
    );
    let bad_key = open(
        &server,
        &server.url("x"),
        &[("AWS_SECRET_ACCESS_KEY", "wrong")],
    )
    .err()
    .unwrap();
    assert!(
        bad_key.contains("refused") && bad_key.contains("AWS_SECRET_ACCESS_KEY"),
        "{bad_key}"
    );
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let unreachable = open(
        &server,
        &server.url("x"),
        &[("AWS_ENDPOINT_URL", &endpoint)],
    )
    .err()
    .unwrap();
    assert!(
        unreachable.contains(&endpoint) && unreachable.contains("AWS_ENDPOINT_URL"),
        "{unreachable}"
    );
    let plain = S3BlobStore::open_with(
        &server.url("x"),
        1,
        &[("AWS_ENDPOINT_URL", &server.endpoint)],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(plain.contains("AWS_ALLOW_HTTP=true"), "{plain}");

    // The coordinator refuses to start with the same message.
    let dir = scratch();
    let out = std::process::Command::new(tessera())
        .args(["coordinator", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .args(["--blobs", "s3://no-such-bucket/farm"])
        .envs(server.env())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot open the blob store s3://no-such-bucket/farm")
            && stderr.contains("does not exist"),
        "{stderr}"
    );
}

#[test]
fn a_farm_with_blobs_in_s3_renders_exactly_and_deleting_frees_the_bucket() {
    let Some(server) = s3_or_skip("a_farm_with_blobs_in_s3") else {
        return;
    };
    let dir = scratch();
    let scene = scene(&["--kind", "anim", "--frames", "6"]);
    let url = server.url("farm");
    let coord = Coordinator::start_env(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--blobs",
            &url,
            "--blob-grace",
            "0.5",
            "--http",
            "127.0.0.1:0",
        ],
        &server.env(),
    );
    // Nothing went to the data directory's blob folder.
    assert!(!dir.path().join("data/blobs").exists());
    let a = worker(&coord.url, dir.path(), "a");
    let b = worker(&coord.url, dir.path(), "b");
    let out = dir.path().join("out");
    let stderr = submit_wait(&coord.url, &scene, "1-6", &out);
    assert!(stderr.contains("uploaded scene:"), "{stderr}");
    let expected: Vec<String> = (1..=6).map(|f| format!("frame_{f:04}.png")).collect();
    assert_eq!(frames_of(&out), expected);
    let refs = dir.path().join("refs");
    reference(&scene, 1, 6, &refs);
    for f in 1..=6 {
        assert_same_pixels(
            &out.join(format!("frame_{f:04}.png")),
            &refs.join(format!("ref_{f:04}.png")),
        );
    }
    let (la, lb) = (a.log(), b.log());
    assert!(
        la.contains("task done") && lb.contains("task done"),
        "a:\n{la}\nb:\n{lb}"
    );
    assert!(la.matches("scene fetched").count() <= 1 && lb.matches("scene fetched").count() <= 1);

    // The scene and six frames are objects in the bucket.
    let bucket = open(&server, &url, &[]).unwrap();
    let keys = bucket.keys().unwrap();
    assert!(keys.len() >= 7, "{keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("farm/")), "{keys:?}");

    // The same scene again is not uploaded again.
    let again = cli(
        &coord.url,
        &["submit", scene.to_str().unwrap(), "--frames", "3", "--wait"],
    );
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(stderr.contains("0 bytes uploaded"), "{stderr}");

    // Fetch reads the frames back from the bucket.
    let jobs: serde_json::Value =
        serde_json::from_str(&cli_ok(&coord.url, &["jobs", "--json"])).unwrap();
    let ids: Vec<String> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_u64().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{jobs:#}");
    let fetched = dir.path().join("fetched");
    cli_ok(
        &coord.url,
        &["fetch", &ids[0], "-o", fetched.to_str().unwrap()],
    );
    assert_eq!(frames_of(&fetched), expected);
    for f in 1..=6 {
        let name = format!("frame_{f:04}.png");
        assert_eq!(
            std::fs::read(fetched.join(&name)).unwrap(),
            std::fs::read(out.join(&name)).unwrap()
        );
    }

    // A large upload over HTTP streams into a multipart upload from the
    // async handler; one whose bytes do not match its digest leaves nothing.
    let api = coord
        .metrics
        .as_deref()
        .unwrap()
        .trim_end_matches("/metrics");
    let token = coord.admin_token();
    let large = contract::pattern(contract::LARGE, 9);
    let d = tessera_coordinator::digest::Digest::of(&large);
    let put = |digest: &str, body: &[u8]| {
        tessera_tests::http::request(
            "PUT",
            &format!("{api}/api/v1/blobs/{digest}"),
            Some(&token),
            &[],
            body,
        )
    };
    let stored = put(&d.to_hex(), &large);
    assert_eq!(
        stored.status,
        200,
        "{}",
        String::from_utf8_lossy(&stored.body)
    );
    assert_eq!(bucket.size(&d), Some(contract::LARGE as u64));
    assert!(bucket.read(&d).unwrap() == large);
    let other = tessera_coordinator::digest::Digest::of(b"not these bytes");
    let refused = put(&other.to_hex(), &large);
    assert_eq!(
        refused.status,
        400,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert!(!bucket.contains(&other));

    // Deleting both jobs frees every object they used. (The upload above,
    // which no job names, is left to the collector's own rules.)
    for id in &ids {
        let deleted = cli(&coord.url, &["delete", id]);
        assert!(deleted.status.success(), "{deleted:?}");
    }
    let emptied = eventually(Duration::from_secs(30), || {
        bucket
            .keys()
            .is_ok_and(|k| k.iter().all(|k| *k == bucket.key(&d)))
    });
    assert!(
        emptied,
        "objects left after deleting every job: {:?}\ncoordinator log:\n{}",
        bucket.keys(),
        coord.proc.log()
    );
}
