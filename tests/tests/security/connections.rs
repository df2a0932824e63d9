//! Issue 21 part 3, connections end: slow-loris connections on both ports
//! are closed within the timeouts, connections past the per-address and
//! total caps are refused, and a normal client is served throughout.
//!
//! The hostile connections come from other loopback addresses (127.0.0.2
//! and up) so that the caps of one address leave the normal client's alone.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use super::*;

/// A connection to `to` from the loopback address `from`.
fn connect_from(rt: &tokio::runtime::Runtime, from: &str, to: &str) -> TcpStream {
    let s = rt
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(format!("{from}:0").parse().unwrap())?;
            socket.connect(to.parse().unwrap()).await
        })
        .unwrap_or_else(|e| panic!("cannot connect to {to} from {from}: {e}"));
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap().to_string()
}

/// The HTTP/2 preface and an empty SETTINGS frame: how a gRPC client opens.
const H2_OPEN: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Reads until the server closes `s`; panics past `limit`. Returns how long
/// that took and what was read.
fn until_closed(mut s: TcpStream, limit: Duration) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (start.elapsed(), got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!(
                    "the server kept a stalled connection open past {limit:?}; read so far: {:?}",
                    String::from_utf8_lossy(&got)
                )
            }
            // Reset by the server: closed as well.
            Err(_) => return (start.elapsed(), got),
        }
    }
}

/// Sends `bytes` one at a time, `gap` apart, until the server closes the
/// connection or they run out.
fn trickle(mut s: TcpStream, bytes: Vec<u8>, gap: Duration) {
    for b in bytes {
        if s.write_all(&[b]).is_err() {
            return;
        }
        std::thread::sleep(gap);
    }
}

/// The normal client: the CLI over gRPC and a GET of the JSON API.
fn served(coord: &Coordinator, api: &str, admin: &str) {
    let out = cli(&coord.url, &["jobs", "--json"]);
    assert!(
        out.status.success(),
        "the CLI was not served: {}",
        stderr(&out)
    );
    let r = tessera_tests::http::get(&format!("{api}/api/v1/jobs"), admin);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn slow_loris_connections_are_closed_within_the_timeouts() {
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--http",
            "127.0.0.1:0",
            "--header-timeout",
            "2",
            "--idle-timeout",
            "3",
            "--body-timeout",
            "2",
        ],
    );
    let api = coord.metrics.clone().unwrap().replace("/metrics", "");
    let http = host_port(&api);
    let grpc = coord.addr.clone();
    let admin = coord.admin_token();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Past any of the timeouts above, with room for a slow machine: a
    // connection still open then was never going to be closed.
    let limit = Duration::from_secs(20);
    let gap = Duration::from_millis(200);
    let mut attacks = Vec::new();
    let mut attack = |name: &'static str, to: &str, send: Vec<u8>, trickled: Vec<u8>| {
        let mut s = connect_from(&rt, "127.0.0.2", to);
        s.write_all(&send).unwrap();
        let reader = s.try_clone().unwrap();
        std::thread::spawn(move || trickle(s, trickled, gap));
        attacks.push((
            name,
            std::thread::spawn(move || until_closed(reader, limit)),
        ));
    };
    attack("HTTP, nothing sent", &http, vec![], vec![]);
    attack(
        "HTTP, headers trickled",
        &http,
        b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n".to_vec(),
        b"X-Slow: a\r\n".repeat(100),
    );
    attack(
        "HTTP, body trickled",
        &http,
        format!(
            "POST /api/v1/blobs/missing HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{\"digests\": ["
        )
        .into_bytes(),
        b"\"0000\", ".repeat(200),
    );
    attack(
        "HTTP, idle after a request",
        &http,
        b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![],
    );
    attack("gRPC, nothing sent", &grpc, vec![], vec![]);
    attack(
        "gRPC, half a preface",
        &grpc,
        H2_OPEN[..10].to_vec(),
        vec![],
    );
    attack(
        "gRPC, preface then silence",
        &grpc,
        H2_OPEN.to_vec(),
        vec![],
    );
    // A gRPC upload that sends one small chunk, then nothing: the body
    // stalls, and the call fails naming --body-timeout.
    let upload = {
        let url = coord.url.clone();
        let admin = admin.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let channel = tonic::transport::Endpoint::from_shared(url)
                    .unwrap()
                    .connect()
                    .await
                    .unwrap();
                let mut blobs = pb::blobs_client::BlobsClient::new(channel);
                let data = vec![7u8; 100_000];
                let first = pb::BlobChunk {
                    digest: blake3::hash(&data).to_hex().to_string(),
                    size: data.len() as u64,
                    data: data[..10].to_vec(),
                };
                let stalled = tokio_stream::StreamExt::chain(
                    tokio_stream::iter(vec![first]),
                    tokio_stream::pending(),
                );
                let start = Instant::now();
                let r = tokio::time::timeout(
                    Duration::from_secs(20),
                    blobs.put_blob(super::authed(stalled, &admin)),
                )
                .await
                .expect("a stalled gRPC upload was never cut off");
                (start.elapsed(), r.map(|_| ()))
            })
        })
    };
    // The normal client is served while the stalled connections are open.
    let mut rounds = 0;
    while attacks.iter().any(|(_, t)| !t.is_finished()) {
        served(&coord, &api, &admin);
        rounds += 1;
    }
    assert!(rounds > 0);
    for (name, t) in attacks {
        let (took, got) = t.join().unwrap_or_else(|_| panic!("{name}: still open"));
        assert!(
            took <= Duration::from_secs(10),
            "{name}: closed only after {took:?}, past the 2-3 s timeouts"
        );
        eprintln!(
            "{name}: closed after {took:?} ({})",
            String::from_utf8_lossy(&got)
                .lines()
                .next()
                .unwrap_or("no answer")
        );
    }
    let (took, r) = upload.join().unwrap();
    let e = r.expect_err("a stalled upload was accepted");
    assert!(
        took <= Duration::from_secs(10),
        "cut off only after {took:?}"
    );
    eprintln!("gRPC, upload stalled: refused after {took:?}: {e}");
    served(&coord, &api, &admin);
}

/// Opens an HTTP connection from `from` and asks for a page without a
/// token: true when it was served (401) and is now held idle, false when
/// refused (503, the reason checked against `reason`).
fn http_held(
    rt: &tokio::runtime::Runtime,
    from: &str,
    to: &str,
    reason: &str,
    held: &mut Vec<TcpStream>,
) -> bool {
    let mut s = connect_from(rt, from, to);
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    if status.starts_with("HTTP/1.1 503") {
        let mut rest = String::new();
        let _ = r.read_to_string(&mut rest);
        assert!(rest.contains(reason), "{status}{rest}");
        return false;
    }
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    held.push(s);
    true
}

/// Opens a gRPC connection from `from`: true when the server answers the
/// preface with its settings, false when it closes the connection.
fn grpc_held(
    rt: &tokio::runtime::Runtime,
    from: &str,
    to: &str,
    held: &mut Vec<TcpStream>,
) -> bool {
    let mut s = connect_from(rt, from, to);
    s.set_read_timeout(Some(LONG)).unwrap();
    let _ = s.write_all(H2_OPEN);
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(n) if n > 0 => {
            held.push(s);
            true
        }
        _ => false,
    }
}

#[test]
fn connections_past_the_caps_are_refused_and_others_served() {
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--http",
            "127.0.0.1:0",
            "--max-connections-per-address",
            "8",
            "--max-connections",
            "20",
        ],
    );
    let api = coord.metrics.clone().unwrap().replace("/metrics", "");
    let http = host_port(&api);
    let grpc = coord.addr.clone();
    let admin = coord.admin_token();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut held = Vec::new();

    // One address: 8 connections over both ports, then refusals.
    for _ in 0..4 {
        assert!(http_held(&rt, "127.0.0.2", &http, "", &mut held));
        assert!(grpc_held(&rt, "127.0.0.2", &grpc, &mut held));
    }
    assert!(!http_held(
        &rt,
        "127.0.0.2",
        &http,
        "--max-connections-per-address",
        &mut held
    ));
    assert!(!grpc_held(&rt, "127.0.0.2", &grpc, &mut held));
    served(&coord, &api, &admin);

    // Another address fills its 8; the next one reaches the total of 20
    // (less what the normal client still holds) and is refused there.
    for _ in 0..8 {
        assert!(grpc_held(&rt, "127.0.0.3", &grpc, &mut held));
    }
    let mut admitted = 0;
    while http_held(
        &rt,
        "127.0.0.4",
        &http,
        "holds its most connections",
        &mut held,
    ) {
        admitted += 1;
        assert!(admitted <= 4, "admitted past --max-connections 20");
    }
    assert!(!grpc_held(&rt, "127.0.0.4", &grpc, &mut held));

    // Closed connections give their places back.
    drop(held);
    assert!(
        eventually(Duration::from_secs(30), || {
            cli(&coord.url, &["jobs", "--json"]).status.success()
        }),
        "the normal client was not served once the flood closed"
    );
    served(&coord, &api, &admin);
}
