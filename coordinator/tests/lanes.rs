//! Reads never wait behind the fleet: with the fleet's runtime held busy, a
//! client's call (`tessera status`, `jobs`) is still answered, while a
//! worker's call waits for the fleet.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessera_coordinator::farm::Config;
use tessera_coordinator::server::Coordinator;
use tessera_proto as pb;

/// How long the fleet's only thread is held.
const HELD: Duration = Duration::from_secs(3);

#[test]
fn a_clients_call_is_answered_while_the_fleets_runtime_is_held_and_a_workers_waits() {
    lanes_hold(false);
}

#[test]
fn the_lanes_hold_over_tls_too() {
    lanes_hold(true);
}

/// A CA and a certificate for 127.0.0.1 signed by it, made with openssl:
/// (CA PEM, certificate PEM, key PEM).
fn certificate(dir: &std::path::Path) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let p = |n: &str| dir.join(n).to_str().unwrap().to_string();
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let runs: [Vec<String>; 3] = [
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=lanes CA",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["-keyout".into(), p("ca.key"), "-out".into(), p("ca.pem")])
        .collect(),
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["-keyout".into(), p("key.pem"), "-out".into(), p("req.csr")])
        .collect(),
        ["x509", "-req", "-days", "2"]
            .iter()
            .map(|s| s.to_string())
            .chain([
                "-in".into(),
                p("req.csr"),
                "-CA".into(),
                p("ca.pem"),
                "-CAkey".into(),
                p("ca.key"),
                "-CAcreateserial".into(),
                "-extfile".into(),
                p("ext.cnf"),
                "-out".into(),
                p("cert.pem"),
            ])
            .collect(),
    ];
    for args in runs {
        let out = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
    (read("ca.pem"), read("cert.pem"), read("key.pem"))
}

fn lanes_hold(tls: bool) {
    let dir = std::env::temp_dir().join(format!("tessera-lanes-{}-{tls}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The fleet's runtime: one thread, so holding it holds the fleet.
    let fleet = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut coord = Coordinator::open(&dir.join("data"), Config::default()).unwrap();
    let ca = if tls {
        let (ca, cert, key) = certificate(&dir);
        coord = coord.with_tls(cert, key);
        Some(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
        )
    } else {
        None
    };
    let token = std::fs::read_to_string(coord.admin_token_path().unwrap())
        .unwrap()
        .trim()
        .to_string();
    let listener = fleet
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let scheme = if tls { "https" } else { "http" };
    let url = format!("{scheme}://{}", listener.local_addr().unwrap());
    let endpoint = move |url: String| {
        let e = tonic::transport::Endpoint::from_shared(url).unwrap();
        match ca.clone() {
            Some(ca) => e.tls_config(ca).unwrap(),
            None => e,
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = fleet.spawn(coord.serve(listener, None, async {
        let _ = stopped.await;
    }));

    // The clients run on a runtime of their own, as `tessera` does.
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
    let list_jobs = |url: String| {
        let bearer = bearer.clone();
        let endpoint = endpoint.clone();
        async move {
            let ch = endpoint(url).connect().await.unwrap();
            let mut farm = pb::farm_client::FarmClient::new(ch);
            let mut req = tonic::Request::new(pb::ListJobsRequest::default());
            req.metadata_mut().insert("authorization", bearer);
            farm.list_jobs(req).await
        }
    };
    clients
        .block_on(list_jobs(url.clone()))
        .expect("the farm answers before the fleet is held");

    // Hold the fleet's only thread.
    let held = Arc::new(AtomicBool::new(false));
    let holding = held.clone();
    fleet.spawn(async move {
        holding.store(true, Ordering::SeqCst);
        std::thread::sleep(HELD);
        holding.store(false, Ordering::SeqCst);
    });
    while !held.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }

    // A client's new connection: sorted, served and answered in its lane.
    let listed = clients.block_on(list_jobs(url.clone()));
    assert!(listed.is_ok(), "{listed:?}");
    assert!(
        held.load(Ordering::SeqCst),
        "the client's call was answered only once the fleet's thread was free"
    );

    // A worker's new connection goes to the fleet, which answers (here a
    // refusal: no worker token) only once its thread is free.
    let registered = clients.block_on(async {
        let ch = endpoint(url.clone()).connect().await.unwrap();
        pb::work_client::WorkClient::new(ch)
            .register(pb::WorkerInfo::default())
            .await
    });
    assert_eq!(registered.unwrap_err().code(), tonic::Code::Unauthenticated);
    assert!(
        !held.load(Ordering::SeqCst),
        "a worker's call was answered while the fleet's thread was held"
    );

    // Close the clients' connections (a graceful stop waits for them).
    drop(clients);
    let _ = stop.send(());
    fleet
        .block_on(server)
        .unwrap()
        .expect("the coordinator stops cleanly");
    let _ = std::fs::remove_dir_all(&dir);
}
