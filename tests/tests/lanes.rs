//! Reads never wait behind the fleet: with the fleet's runtime held busy, a
//! client's call (`tessera status`, `jobs`) is still answered, while a
//! worker's call waits for the fleet.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessera_coordinator::farm::Config;
use tessera_coordinator::server::Coordinator;
use tessera_proto as pb;

/// The longest the fleet's only thread is held, should the client's call
/// never be answered (the test then fails).
const HOLD_LIMIT: Duration = Duration::from_secs(60);

/// How long a worker's call is given, the fleet still held, to reach the
/// coordinator and (wrongly) be answered: a call served in the clients'
/// lane is answered within milliseconds.
const WORKER_WINDOW: Duration = Duration::from_secs(1);

#[test]
fn a_clients_call_is_answered_while_the_fleets_runtime_is_held_and_a_workers_waits() {
    lanes_hold(false);
}

#[test]
fn the_lanes_hold_over_tls_too() {
    lanes_hold(true);
}

fn lanes_hold(tls: bool) {
    let scratch = tessera_tests::scratch();
    let dir = scratch.path();
    // The fleet's runtime: one thread, so holding it holds the fleet.
    let fleet = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut coord = Coordinator::open(&dir.join("data"), Config::default()).unwrap();
    let ca = if tls {
        let files = tessera_tests::tls_files(dir);
        let read = |p: &std::path::Path| std::fs::read(p).unwrap();
        let (ca, cert, key) = (read(&files.ca), read(&files.cert), read(&files.key));
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

    // Hold the fleet's only thread until told to let go.
    let held = Arc::new(AtomicBool::new(false));
    let (started, holding_now) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holding = held.clone();
    fleet.spawn(async move {
        holding.store(true, Ordering::SeqCst);
        started.send(()).unwrap();
        let _ = released.recv_timeout(HOLD_LIMIT);
        holding.store(false, Ordering::SeqCst);
    });
    holding_now.recv().unwrap();

    // A client's new connection: sorted, served and answered in its lane.
    let listed = clients.block_on(list_jobs(url.clone()));
    assert!(listed.is_ok(), "{listed:?}");
    assert!(
        held.load(Ordering::SeqCst),
        "the client's call was answered only once the fleet's thread was free"
    );

    // A worker's new connection goes to the fleet, which answers (here a
    // refusal: no worker token) only once its thread is free.
    let worker = {
        let (url, held) = (url.clone(), held.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let registered = rt.block_on(async {
                let ch = endpoint(url).connect().await.unwrap();
                pb::work_client::WorkClient::new(ch)
                    .register(pb::WorkerInfo::default())
                    .await
            });
            (registered, held.load(Ordering::SeqCst))
        })
    };
    std::thread::sleep(WORKER_WINDOW);
    release.send(()).unwrap();
    let (registered, answered_while_held) = worker.join().unwrap();
    assert_eq!(registered.unwrap_err().code(), tonic::Code::Unauthenticated);
    assert!(
        !answered_while_held,
        "a worker's call was answered while the fleet's thread was held"
    );

    // Close the clients' connections (a graceful stop waits for them).
    drop(clients);
    let _ = stop.send(());
    fleet
        .block_on(server)
        .unwrap()
        .expect("the coordinator stops cleanly");
}
