//! The PostgreSQL metadata store against a real server: the store suite
//! every store passes, fencing, and a farm of real processes on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_coordinator::error::{Backend, StoreFailure};
use tessera_coordinator::ha::{Attempt, Election, Lease};
use tessera_coordinator::store::suite::{self, Opener};
use tessera_coordinator::store::{MetaStore, PgStore, Record, StoreHealth};
use tessera_coordinator::Error;
use tessera_tests::openssl;
use tessera_tests::postgres::PgServer;
use tessera_tests::proxy::SilentProxy;

/// A database per case on one server.
struct PgOpener<'a>(&'a PgServer);

impl Opener for PgOpener<'_> {
    fn fresh(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error> {
        self.0
            .create_db(case)
            .map_err(|m| StoreFailure::new(Backend::Postgres { at: None }, m))?;
        self.reopen(case)
    }

    fn reopen(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error> {
        Ok(Arc::new(PgStore::open(&self.0.url_for(case))?))
    }
}

#[test]
fn the_store_suite_passes_on_postgres() {
    let Some(pg) = PgServer::start_or_skip("the_store_suite_passes_on_postgres") else {
        return;
    };
    suite::run_all(&mut PgOpener(&pg));
}

#[test]
fn migrations_are_versioned_and_applied_once() {
    let Some(pg) = PgServer::start_or_skip("migrations_are_versioned_and_applied_once") else {
        return;
    };
    let url = pg.url();
    // Two coordinators opening a fresh database at once: each migration runs once.
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || PgStore::open(&url).map(drop))
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    drop(PgStore::open(&url).unwrap());
    assert_eq!(
        pg.psql(
            "tessera",
            "SELECT version, name FROM tessera_migrations ORDER BY version"
        )
        .unwrap(),
        "1|initial\n2|leader lease"
    );
    // A schema from a newer Tessera is refused with a message that says so.
    pg.psql(
        "tessera",
        "INSERT INTO tessera_migrations (version, name) VALUES (999, 'future')",
    )
    .unwrap();
    let err = PgStore::open(&url)
        .err()
        .expect("a newer schema is refused");
    assert!(err.to_string().contains("newer Tessera"), "{err}");
}

#[test]
fn a_deposed_store_writes_nothing() {
    let Some(pg) = PgServer::start_or_skip("a_deposed_store_writes_nothing") else {
        return;
    };
    let unfenced = PgStore::open(&pg.url()).unwrap();
    pg.psql(
        "tessera",
        "UPDATE tessera_leader SET epoch = 4, url = 'http://a:7878', expires_at = now() + interval '1 hour'",
    )
    .unwrap();
    let store = unfenced.fenced(4, Lease::until(Instant::now() + Duration::from_secs(3600)));
    let job = suite::job(1);
    store.write(&[Record::Job(&job)]).unwrap();
    // Another coordinator takes over: epoch 5.
    pg.psql(
        "tessera",
        "UPDATE tessera_leader SET epoch = 5, url = 'http://b:7878'",
    )
    .unwrap();
    let mut changed = job.clone();
    changed.priority = 7;
    let err = store
        .write(&[Record::Job(&changed), Record::Job(&suite::job(2))])
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("no longer active") && msg.contains("http://b:7878"),
        "{msg}"
    );
    let snap = store.load().unwrap();
    assert_eq!(snap.jobs.len(), 1, "nothing of the refused batch is stored");
    assert_eq!(snap.jobs[&job.id].priority, 0);
}

#[test]
fn a_bad_url_or_an_absent_server_is_a_clear_error() {
    let err = PgStore::open("postgres://nobody@127.0.0.1:1/none")
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("cannot connect to PostgreSQL at postgres://nobody@127.0.0.1:1/none"),
        "{msg}"
    );
    let err = PgStore::open("postgres://a:secret@[bad").err().unwrap();
    let msg = err.to_string();
    assert!(msg.contains("not a PostgreSQL URL"), "{msg}");
    assert!(!msg.contains("secret"), "the password stays out: {msg}");
}

#[test]
fn the_coordinator_explains_a_bad_store_and_status_finds_no_one() {
    let dir = tessera_tests::scratch();
    let data = dir.path().join("data");
    let run = |args: &[&str]| {
        std::process::Command::new(tessera_tests::tessera())
            .args(args)
            .env_remove("TESSERA_STORE")
            .env_remove("TESSERA_COORDINATOR")
            .output()
            .unwrap()
    };
    let data = data.to_str().unwrap();
    let out = run(&[
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--data",
        data,
        "--store",
        "mysql://x/y",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--store mysql://x/y: not a store; use sled"),
        "{err}"
    );
    let out = run(&[
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--data",
        data,
        "--store",
        "postgres://nobody:hunter2@127.0.0.1:1/none",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cannot connect to PostgreSQL at postgres://nobody:***@127.0.0.1:1/none"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "the password stays out: {err}");
    // Nobody listens at either address: --status says so and fails.
    let out = run(&[
        "--coordinator",
        "http://127.0.0.1:1,http://127.0.0.1:2",
        "coordinator",
        "--status",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("http://127.0.0.1:1  unreachable"), "{text}");
    assert!(text.contains("no coordinator at"), "{text}");
}

#[test]
fn a_fenced_store_writes_nothing_once_its_lease_expired_or_lapsed() {
    let Some(pg) = PgServer::start_or_skip("a_fenced_store_writes_nothing_once_its_lease_expired")
    else {
        return;
    };
    let unfenced = PgStore::open(&pg.url()).unwrap();
    // Epoch 3 is this coordinator's, but its lease expired on the server.
    pg.psql(
        "tessera",
        "UPDATE tessera_leader SET epoch = 3, url = 'http://a:7878', expires_at = now() - interval '1 second'",
    )
    .unwrap();
    let store = unfenced.fenced(3, Lease::until(Instant::now() + Duration::from_secs(3600)));
    let err = store.write(&[Record::Job(&suite::job(1))]).unwrap_err();
    assert!(matches!(err, Error::NotActive(_)), "{err}");
    assert!(err.to_string().contains("expired"), "{err}");
    // Its own lease lapsed: refused before PostgreSQL is asked.
    pg.psql(
        "tessera",
        "UPDATE tessera_leader SET expires_at = now() + interval '1 hour'",
    )
    .unwrap();
    let lapsed = unfenced.fenced(3, Lease::until(Instant::now()));
    let err = lapsed.write(&[Record::Job(&suite::job(1))]).unwrap_err();
    assert!(matches!(err, Error::NotActive(_)), "{err}");
    assert!(err.to_string().contains("lapsed"), "{err}");
    assert!(unfenced.load().unwrap().jobs.is_empty());
    // Within its lease, the same handle writes.
    store.write(&[Record::Job(&suite::job(1))]).unwrap();
    assert_eq!(unfenced.load().unwrap().jobs.len(), 1);
}

#[test]
fn a_store_call_on_a_silent_network_fails_within_its_deadline_with_a_clear_error() {
    let Some(pg) = PgServer::start_or_skip("a_store_call_on_a_silent_network_fails") else {
        return;
    };
    let proxy = SilentProxy::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let url = format!("postgres://tessera@127.0.0.1:{}/tessera", proxy.port());
    let deadline = Duration::from_secs(1);
    let store = PgStore::open_as(&url, "tessera test", deadline).unwrap();
    let health = store
        .health()
        .expect("a PostgreSQL store reports its health");
    store.write(&[Record::Job(&suite::job(1))]).unwrap();
    assert!(health.up());

    proxy.black_hole();
    let started = Instant::now();
    let err = store.write(&[Record::Job(&suite::job(2))]).unwrap_err();
    let took = started.elapsed();
    let msg = err.to_string();
    assert!(matches!(err, Error::StoreUnavailable(_)), "{msg}");
    assert!(
        msg.contains("PostgreSQL at 127.0.0.1") && msg.contains("did not answer within 1 s"),
        "{msg}"
    );
    assert!(
        msg.contains("check that the PostgreSQL server runs"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(5), "the deadline held: {took:?}");
    assert!(!health.up());
    assert!(
        health.line().contains("unreachable since"),
        "{}",
        health.line()
    );
    // Reads have a deadline too.
    let started = Instant::now();
    assert!(store.load_archived(suite::job(1).id).is_err());
    assert!(started.elapsed() < Duration::from_secs(5));

    proxy.restore();
    // The stuck connections were closed; new ones work at once.
    store.write(&[Record::Job(&suite::job(3))]).unwrap();
    assert!(health.up());
    let jobs = PgStore::open(&pg.url()).unwrap().load().unwrap().jobs;
    assert!(jobs.contains_key(&suite::job(1).id) && jobs.contains_key(&suite::job(3).id));
    assert!(
        !jobs.contains_key(&suite::job(2).id),
        "the refused write is not stored"
    );
}

/// Runs `f` on a fresh current-thread runtime.
fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn a_silent_active_lapses_before_the_standby_takes_over_and_is_fenced() {
    let Some(pg) = PgServer::start_or_skip("a_silent_active_lapses_before_the_standby") else {
        return;
    };
    drop(PgStore::open(&pg.url()).unwrap());
    let proxy = SilentProxy::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let via_proxy = format!("postgres://tessera@127.0.0.1:{}/tessera", proxy.port());
    let failover = Duration::from_secs(2);
    block_on(async {
        let a_store = PgStore::open_as(&via_proxy, "tessera a", failover).unwrap();
        let a = Election::connect(
            &via_proxy,
            "a",
            "http://a",
            failover,
            a_store.health_handle(),
        )
        .await
        .unwrap();
        let b = Election::connect(
            &pg.url(),
            "b",
            "http://b",
            failover,
            StoreHealth::new("PostgreSQL"),
        )
        .await
        .unwrap();
        let Attempt::Won(term) = a.try_take_over().await.unwrap() else {
            panic!("the first coordinator takes over");
        };
        assert!(matches!(
            b.try_take_over().await.unwrap(),
            Attempt::Standby(l) if l.url == "http://a" && !l.expired
        ));
        let a_writes = a_store.fenced(term.epoch, term.lease.clone());
        let hold = tokio::spawn({
            let term = term.clone();
            async move { a.hold(&term).await }
        });
        tokio::time::sleep(failover / 2).await;
        assert!(term.lease.valid(), "renewals keep the lease");
        proxy.black_hole();
        let cut = Instant::now();
        let why = hold.await.unwrap();
        let lapsed = cut.elapsed();
        assert!(!term.lease.valid());
        assert!(why.contains("did not confirm"), "{why}");
        assert!(lapsed <= failover, "A gave up {lapsed:?} after the cut");
        // B cannot have taken over before A gave up; it does within
        // failover + its poll + its deadline of the cut.
        let won = loop {
            match b.try_take_over().await.unwrap() {
                Attempt::Won(t) => break t,
                Attempt::Standby(_) => {
                    tokio::time::sleep(b.timing.poll).await;
                }
            }
        };
        let took_over = cut.elapsed();
        eprintln!(
            "failover 2 s: A lapsed {:.2} s after the cut, B took over {:.2} s after it",
            lapsed.as_secs_f64(),
            took_over.as_secs_f64()
        );
        assert!(
            took_over > lapsed,
            "A lapsed at {lapsed:?}, B took over at {took_over:?}"
        );
        assert!(
            took_over
                <= failover + b.timing.poll + 2 * b.timing.deadline + Duration::from_millis(500),
            "B took over {took_over:?} after the cut"
        );
        assert_eq!(won.epoch, term.epoch + 1);
        // Once the network heals, A's writes are refused: its lease lapsed
        // here, and its epoch is gone there.
        proxy.restore();
        let err = tokio::task::spawn_blocking(move || {
            a_writes.write(&[Record::Job(&suite::job(9))]).unwrap_err()
        })
        .await
        .unwrap();
        assert!(matches!(err, Error::NotActive(_)), "{err}");
        let stale = a_store.fenced(
            term.epoch,
            Lease::until(Instant::now() + Duration::from_secs(60)),
        );
        let err = tokio::task::spawn_blocking(move || {
            stale.write(&[Record::Job(&suite::job(9))]).unwrap_err()
        })
        .await
        .unwrap();
        assert!(err.to_string().contains("no longer active"), "{err}");
        assert!(PgStore::open(&pg.url())
            .unwrap()
            .load()
            .unwrap()
            .jobs
            .is_empty());
    });
}

/// A CA `NAME.pem` (key `NAME.key`) in `dir`.
fn test_ca(dir: &std::path::Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

#[test]
fn tls_to_postgres_verifies_the_ca_and_the_host_and_says_what_to_fix() {
    let Some(pg) = PgServer::start_or_skip("tls_to_postgres") else {
        return;
    };
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        eprintln!("skipped tls_to_postgres: no openssl to make the test certificates");
        return;
    }
    // A CA, a server certificate it signs for `localhost` only, and a CA
    // that signed nothing.
    let dir = tessera_tests::scratch();
    let d = dir.path();
    test_ca(d, "ca");
    test_ca(d, "other-ca");
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
    pg.enable_ssl(&d.join("server.crt"), &d.join("server.key"))
        .unwrap();
    let port = pg.port();
    let url = |host: &str, ca: &str| {
        format!(
            "postgres://tessera@{host}:{port}/tessera?sslmode=verify-full&sslrootcert={}",
            d.join(ca).display()
        )
    };
    let tls_sessions = || {
        pg.psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.datname = 'tessera' AND s.ssl",
        )
        .unwrap()
    };

    // The right CA and host: the store opens, over TLS.
    let started = Instant::now();
    let store = PgStore::open(&url("localhost", "ca.pem")).unwrap();
    let opened = started.elapsed();
    store.load().unwrap();
    assert_ne!(tls_sessions(), "0", "the store's session is not TLS");
    drop(store);

    // Another CA, or a host the certificate does not name: refused, saying
    // TLS, the certificate and the fix.
    for (url, rustls_words) in [
        (url("localhost", "other-ca.pem"), "UnknownIssuer"),
        (url("127.0.0.1", "ca.pem"), "not valid for name"),
    ] {
        let msg = PgStore::open(&url).err().expect("refused").to_string();
        for words in [
            "TLS to PostgreSQL failed",
            "invalid peer certificate",
            rustls_words,
            "sslrootcert",
            "fix sslrootcert or the host",
        ] {
            assert!(msg.contains(words), "{url}: no {words:?} in: {msg}");
        }
        eprintln!("refused: {msg}");
    }

    // Plain connections still work where the server allows them.
    let plain = format!("postgres://tessera@127.0.0.1:{port}/tessera?sslmode=disable");
    PgStore::open(&plain).unwrap().load().unwrap();

    // A coordinator on it: up with the right CA, and with the wrong one it
    // exits at once with the same words.
    let data = d.join("data");
    let coord = tessera_tests::postgres::PgCoordinator::start(
        &data,
        "127.0.0.1:0",
        &url("localhost", "ca.pem"),
        d.join("blobs").to_str().unwrap(),
        &[],
        &[],
    );
    assert!(
        coord
            .wait_line("active (epoch 1)", Duration::from_secs(30))
            .is_some(),
        "{:?}\n{}",
        coord.lines(),
        coord.proc.log()
    );
    assert_ne!(tls_sessions(), "0");
    let out = std::process::Command::new(tessera_tests::tessera())
        .args(["coordinator", "--listen", "127.0.0.1:0", "--data"])
        .arg(d.join("data-b"))
        .args(["--store", &url("localhost", "other-ca.pem")])
        .env_remove("TESSERA_STORE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("TLS to PostgreSQL failed") && err.contains("UnknownIssuer"),
        "{err}"
    );
    eprintln!(
        "TLS to PostgreSQL: the store opened over verify-full in {:.0} ms",
        opened.as_secs_f64() * 1000.0
    );
}
