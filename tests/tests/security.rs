//! No one in: tokens, roles, ownership, TLS, and a corpus of bad input that
//! must each get a clear error without harming the coordinator or its jobs.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use tessera_proto as pb;
use tessera_tests::*;

#[path = "security/connections.rs"]
mod connections;
#[path = "security/holes.rs"]
mod holes;
#[path = "security/lanes.rs"]
mod lanes;
use lanes::{lanes, render_refuses_strangers};

const LONG: Duration = Duration::from_secs(300);

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn add_user(coord: &Coordinator, name: &str, role: &str) -> String {
    let out = cli(&coord.url, &["users", "add", name, "--role", role]);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn submit_as(url: &str, token: &str, scene: &Path) -> u64 {
    let out = cli_as(
        url,
        Some(token),
        &["submit", scene.to_str().unwrap(), "--frames", "1"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn tokens_roles_and_ownership() {
    let scene = tiny_scene("still", 4, 1);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let url = coord.url.clone();
    let token_file = dir.path().join("data/admin.token");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the admin token is for its owner only");
    let alice = add_user(&coord, "alice", "user");
    let bob = add_user(&coord, "bob", "user");
    let _w = worker(&url, dir.path(), "a");

    let job = submit_as(&url, &alice, &scene);
    wait_for(&url, job, LONG, "the job to end", |j| j["state"] == "done");
    let id = job.to_string();

    let none = cli_as(&url, None, &["jobs"]);
    assert!(
        !none.status.success() && stderr(&none).contains("no token given"),
        "{}",
        stderr(&none)
    );
    let bad = cli_as(&url, Some("tsr_0000"), &["jobs"]);
    assert!(
        stderr(&bad).contains("the token is not valid"),
        "{}",
        stderr(&bad)
    );

    // Bob sees nothing of Alice's: her job is "not found" to him.
    let listed: serde_json::Value =
        serde_json::from_slice(&cli_as(&url, Some(&bob), &["jobs", "--json"]).stdout).unwrap();
    assert_eq!(listed, serde_json::json!([]));
    let fetch_dir = dir.path().join("stolen");
    for args in [
        vec!["status", id.as_str()],
        vec!["fetch", id.as_str(), "-o", fetch_dir.to_str().unwrap()],
        vec!["cancel", id.as_str()],
        vec!["retry", id.as_str()],
        vec!["pause", id.as_str()],
    ] {
        let out = cli_as(&url, Some(&bob), &args);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr(&out).contains(&format!("job {job} not found")),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(!fetch_dir.exists());
    // Alice sees hers; the admin sees everything.
    let hers: serde_json::Value =
        serde_json::from_slice(&cli_as(&url, Some(&alice), &["jobs", "--json"]).stdout).unwrap();
    assert_eq!(hers[0]["owner"], "alice");
    let all: serde_json::Value = serde_json::from_str(&cli_ok(&url, &["jobs", "--json"])).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1);

    // Roles: users do not manage users; worker tokens do not submit; user
    // tokens do not join the farm.
    let denied = cli_as(&url, Some(&alice), &["users", "add", "mallory"]);
    assert!(
        stderr(&denied).contains("only an admin manages users"),
        "{}",
        stderr(&denied)
    );
    let worker_token = add_user(&coord, "render-01", "worker");
    let denied = cli_as(
        &url,
        Some(&worker_token),
        &["submit", scene.to_str().unwrap(), "--frames", "1"],
    );
    assert!(
        stderr(&denied).contains("a worker token cannot do this"),
        "{}",
        stderr(&denied)
    );
    let out = std::process::Command::new(tessera())
        .args(["worker", "--coordinator", &url, "--cache"])
        .arg(dir.path().join("cache-intruder"))
        .env("TESSERA_TOKEN", &alice)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("a user token cannot do this"),
        "{}",
        stderr(&out)
    );

    // A removed user's token stops working at once.
    cli_ok(&url, &["users", "remove", "bob"]);
    let gone = cli_as(&url, Some(&bob), &["jobs"]);
    assert!(stderr(&gone).contains("the token is not valid"));
    let users = cli_ok(&url, &["users", "list"]);
    assert!(
        users.contains("alice") && users.contains("admin") && !users.contains("bob"),
        "{users}"
    );
}

#[test]
fn tls_end_to_end_and_no_plain_text_off_loopback() {
    let scene = tiny_scene("still", 4, 1);
    let dir = scratch();
    let TlsFiles { ca, cert, key } = tls_files(dir.path());
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-ca-for-tests",
            ca.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
        ],
    );
    assert!(coord.url.starts_with("https://"));
    // The HTTP port serves the API over TLS with the same certificate.
    let metrics = coord.metrics.clone().expect("started with --http");
    assert!(metrics.starts_with("https://"), "{metrics}");
    let port = metrics
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/metrics");
    let whoami = |scheme: &str, ca_file: Option<&std::path::Path>| {
        let mut curl = std::process::Command::new("curl");
        curl.args(["-sS", "--max-time", "10", "-H"])
            .arg(format!("Authorization: Bearer {}", coord.admin_token()))
            .arg(format!("{scheme}://localhost:{port}/api/v1/whoami"));
        if let Some(ca) = ca_file {
            curl.arg("--cacert").arg(ca);
        }
        curl.output().unwrap()
    };
    let ok = whoami("https", Some(&ca));
    let body = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success() && body.contains("\"role\":\"admin\""),
        "{body} {}",
        stderr(&ok)
    );
    assert!(
        !whoami("https", None).status.success(),
        "an unknown CA is refused"
    );
    assert!(
        !whoami("http", None).status.success(),
        "no plain text on the TLS port"
    );
    let _w = worker(&coord.url, dir.path(), "a");
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1",
            "--wait",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(out.join("frame_0001.png").is_file());
    // Without the CA, a client refuses to talk; plain text to a TLS port fails.
    let token = coord.admin_token();
    let mut no_ca = std::process::Command::new(tessera());
    let no_ca = no_ca
        .args(["jobs"])
        .env("TESSERA_COORDINATOR", &coord.url)
        .env("TESSERA_TOKEN", &token)
        .output()
        .unwrap();
    assert!(stderr(&no_ca).contains("pass --ca"), "{}", stderr(&no_ca));
    let plain = cli_as(&format!("http://{}", coord.addr), Some(&token), &["jobs"]);
    assert!(!plain.status.success());

    let open = std::process::Command::new(tessera())
        .args(["coordinator", "--listen", "0.0.0.0:0", "--data"])
        .arg(dir.path().join("open"))
        .output()
        .unwrap();
    assert!(!open.status.success());
    assert!(
        stderr(&open).contains("tokens would travel in plain text"),
        "{}",
        stderr(&open)
    );
}

/// A gRPC codec that sends bytes as they are: for malformed messages.
#[derive(Clone, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

fn authed<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

#[test]
fn a_corpus_of_bad_input_gets_clear_errors_and_harms_nothing() {
    let good = tiny_scene("still", 4, 1);
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--max-frames",
            "1000",
            "--max-tiles",
            "64",
            "--max-upload-mib",
            "2",
            "--max-workers-per-token",
            "2",
            "--max-slots",
            "8",
            "--max-pixels",
            "4096x4096",
            "--http",
            "127.0.0.1:0",
        ],
    );
    let url = coord.url.clone();
    let _w = worker(&url, dir.path(), "a");
    let alice = add_user(&coord, "alice", "user");
    let existing = submit_as(&url, &alice, &good);
    let before = wait_for(&url, existing, LONG, "the job to end", |j| {
        j["state"] == "done"
    });
    let g = good.to_str().unwrap();

    let files = dir.path();
    let write = |name: &str, bytes: &[u8]| {
        let p = files.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let empty = write("empty.blend", b"");
    let random = write(
        "random.blend",
        &(0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect::<Vec<_>>(),
    );
    let whole = std::fs::read(&good).unwrap();
    let truncated = write("truncated.blend", &whole[..whole.len() / 2]);
    let header_only = write("header.blend", b"BLENDER-v304");
    let mut big = whole.clone();
    let pad = vec![0u8; 3 << 20];
    big.splice(12..12, pad);
    let oversized = write("oversized.blend", &big);
    // Wider than --max-pixels 4096x4096 (the CLI reads the size with Blender).
    let wide = scene(&[
        "--kind", "still", "--width", "5000", "--height", "100", "--frames", "1",
    ]);
    let wide = wide.to_str().unwrap();
    // Overlapping ranges: once expanded part by part, for minutes.
    let repetitive = "1-50000,".repeat(100_000 / 8);
    let repetitive = repetitive.trim_end_matches(',');

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["submit", &empty, "--frames", "1"],
            "empty or truncated",
        ),
        (
            vec!["submit", &random, "--frames", "1"],
            "is not a Blender file",
        ),
        (
            vec!["submit", &truncated, "--frames", "1"],
            "is truncated (no ENDB block",
        ),
        (
            vec!["submit", &header_only, "--frames", "1"],
            "is truncated (no ENDB block",
        ),
        (
            vec!["submit", &oversized, "--frames", "1"],
            "over the coordinator's upload limit",
        ),
        (vec!["submit", g, "--frames", "5-1"], "runs backwards"),
        (vec!["submit", g, "--frames", "1-9x0"], "step of 0"),
        (vec!["submit", g, "--frames", "one"], "is not a frame"),
        (
            vec!["submit", g, "--frames", "1-100000"],
            "over the limit of 1000",
        ),
        (
            vec!["submit", g, "--frames", "1", "--chunk", "0"],
            "--chunk 0 is not a frame count",
        ),
        (
            vec!["submit", g, "--frames", "1", "--chunk", "-2"],
            "--chunk -2 is not a frame count",
        ),
        (
            vec!["submit", g, "--frames", "1", "--tiles", "9x9"],
            "over the limit of 64 tiles",
        ),
        (
            vec!["submit", g, "--frames", "1", "--tiles", "33x1"],
            "tiles under 1 px",
        ),
        (
            vec!["submit", g, "--frames", "1", "--tiles", "x"],
            "is not a tile grid",
        ),
        (
            vec!["submit", g, "--frames", "1", "--min-vram", "-4"],
            "is not a memory size",
        ),
        (
            vec!["submit", g, "--frames", "1", "--tag", "../etc"],
            "is not a tag",
        ),
        (vec!["status", "4242"], "job 4242 not found"),
        (
            vec!["fetch", "4242", "-o", "/tmp/none"],
            "job 4242 not found",
        ),
        (vec!["cancel", "4242"], "job 4242 not found"),
        (vec!["users", "add", "../../root"], "is not a user name"),
        (
            vec!["submit", g, "--frames", repetitive],
            "over the limit of 1000",
        ),
        (
            vec!["submit", wide],
            "5000x100 pixels, over the coordinator's limit of 4096x4096 (--max-pixels)",
        ),
    ];
    let n_cli = cases.len();
    for (args, want) in &cases {
        let out = cli(&url, args);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stderr(&out).contains(want),
            "{args:?}: expected `{want}` in: {}",
            stderr(&out)
        );
    }
    // Token cases, and another user's job.
    let admin_token = coord.admin_token();
    let bob = add_user(&coord, "bob", "user");
    let bad_tokens: Vec<(Option<&str>, Vec<&str>, &str)> = vec![
        (None, vec!["jobs"], "no token given"),
        (Some("not-a-token"), vec!["jobs"], "the token is not valid"),
        (
            Some("tsr_ffff"),
            vec!["status", "1"],
            "the token is not valid",
        ),
        (
            Some(admin_token.as_str()),
            vec!["users", "remove", "admin"],
            "last admin",
        ),
    ];
    let mut extra = 0;
    for (token, args, want) in &bad_tokens {
        let out = cli_as(&url, *token, args);
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        extra += 1;
    }
    let out = cli_as(&url, Some(&bob), &["status", &existing.to_string()]);
    assert!(
        stderr(&out).contains("not found"),
        "another user's job: {}",
        stderr(&out)
    );
    extra += 1;

    // Straight to the port: a wrong digest, malformed protobuf, raw garbage.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut blobs = pb::blobs_client::BlobsClient::new(channel.clone());
        let claimed = blake3::hash(b"one thing").to_hex().to_string();
        let chunk = pb::BlobChunk {
            digest: claimed,
            size: 7,
            data: b"another".to_vec(),
        };
        let err = blobs
            .put_blob(authed(tokio_stream::iter(vec![chunk]), &alice))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains("does not match its digest"),
            "{}",
            err.message()
        );

        let bad_digest = pb::JobSpec {
            scene_digest: "zz".into(),
            frames: "1".into(),
            ..Default::default()
        };
        let mut farm = pb::farm_client::FarmClient::new(channel.clone());
        let err = farm
            .submit_job(authed(bad_digest, &alice))
            .await
            .unwrap_err();
        assert!(
            err.message().contains("is not a blake3 digest"),
            "{}",
            err.message()
        );

        for (path, body) in [
            (
                "/tessera.v1.Farm/SubmitJob",
                vec![0xff, 0xff, 0xff, 0xff, 0x0f],
            ),
            ("/tessera.v1.Farm/GetJob", vec![0x08]),
            ("/tessera.v1.Work/Lease", (0..200u8).collect::<Vec<_>>()),
            (
                "/tessera.v1.Blobs/MissingBlobs",
                vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x07],
            ),
        ] {
            let mut grpc = tonic::client::Grpc::new(channel.clone());
            grpc.ready().await.unwrap();
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
            let err = grpc
                .unary(authed(body, &admin_token), path.clone(), Raw)
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err.code(),
                    tonic::Code::Internal | tonic::Code::InvalidArgument
                ),
                "{path}: {err:?}"
            );
            assert!(
                err.message().to_lowercase().contains("decode"),
                "{path}: {}",
                err.message()
            );
        }
        extra += 6;
    });
    for garbage in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x09\xff\xff\xff\xff\xff",
        &[0u8; 64],
    ] {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(&coord.addr).unwrap();
        let _ = s.write_all(garbage);
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = std::io::Read::read(&mut s, &mut [0u8; 256]);
        extra += 1;
    }
    extra += lanes(&rt, &coord, &whole, &alice, &bob);
    extra += render_refuses_strangers(&admin_token);
    extra += holes::file_sets(&rt, &url, &whole, &alice);
    extra += holes::hashes_and_tokens(&url, &good, &alice, files);
    extra += holes::metrics_per_user(&coord, existing, &alice, &bob);
    extra += holes::pixels_from_blender(&rt, &url, Path::new(wide), &alice);
    let corpus = n_cli + extra;
    eprintln!("bad-input corpus: {corpus} cases");
    assert!(corpus >= 50, "a corpus of at least 50 cases, not {corpus}");

    // The coordinator is up and the existing job is as it was.
    let after = status(&url, existing);
    assert_eq!(after["state"], before["state"]);
    assert_eq!(after["outputs"], before["outputs"]);
    assert_eq!(after["tasks"], before["tasks"]);
    let jobs: serde_json::Value = serde_json::from_str(&cli_ok(&url, &["jobs", "--json"])).unwrap();
    assert_eq!(
        jobs.as_array().unwrap().len(),
        3,
        "no bad input became a job (the others are the canceled `lane` job and the failed too-wide one)"
    );
}
