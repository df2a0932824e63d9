//! The PostgreSQL metadata store against a real server: the store suite
//! every store passes, fencing, and a farm of real processes on it.

use std::sync::Arc;

use tessera_coordinator::store::suite::{self, Opener};
use tessera_coordinator::store::{MetaStore, PgStore, Record};
use tessera_coordinator::Error;
use tessera_tests::postgres::PgServer;

/// A database per case on one server.
struct PgOpener<'a>(&'a PgServer);

impl Opener for PgOpener<'_> {
    fn fresh(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error> {
        self.0.create_db(case).map_err(Error::Store)?;
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
        "1|initial"
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
    let store = PgStore::open(&pg.url()).unwrap();
    pg.psql(
        "tessera",
        "UPDATE tessera_leader SET epoch = 4, url = 'http://a:7878'",
    )
    .unwrap();
    store.fence(4);
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
