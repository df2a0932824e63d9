//! Metadata in PostgreSQL 15+ (`tessera coordinator --store postgres://...`).
//!
//! Each record kind has a table (`tessera_jobs`, `tessera_tasks`, ...) whose
//! rows hold the record's JSON, as the sled store keeps it. One
//! group-committed batch ([`MetaStore::write`]) is one transaction with
//! synchronous commit: within a batch the last record for a key wins, and
//! each table gets one bulk statement (`unnest` of arrays), so a batch of
//! thousands of changes costs a handful of round trips and one WAL flush.
//!
//! **Fencing.** With several coordinators on one database (active and
//! standby, see [`crate::ha`]), the active one writes through a handle
//! fenced by its leadership epoch and lease ([`PgStore::fenced`]); every
//! batch first reads the leader row `FOR SHARE` and writes nothing unless
//! the epoch is still its own and its lease has not expired on the server's
//! clock. A standby taking over bumps the epoch with an `UPDATE` of that
//! row, which waits for any batch in flight; so a deposed coordinator can
//! never write again, and the new one reads every batch the old one
//! committed. The handle also refuses every call once the lease lapsed on
//! this machine's clock, and abandons a call in flight when it does.
//!
//! **Deadlines.** Every call has one (`--failover-seconds`, or
//! [`DEFAULT_DEADLINE`]; reading the whole state at a takeover gets at
//! least two minutes): the client gives up, and the server enforces the
//! same bound with `statement_timeout`, `lock_timeout` and
//! `idle_in_transaction_session_timeout`, so a session whose client went
//! silent mid-transaction releases its locks. A connection abandoned at a
//! deadline is closed, never reused. An unreachable or silent server is
//! [`Error::StoreUnavailable`], naming PostgreSQL and what to check;
//! [`StoreHealth`] keeps since when, for `/metrics` and the standby's words.
//!
//! **Claiming tasks.** The issue sketches claiming tasks with `SELECT ... FOR
//! UPDATE SKIP LOCKED`. That suits many schedulers sharing a table. Here one
//! fenced active coordinator schedules in memory (priority, fair share,
//! warm sessions, requirements: microseconds per decision, see
//! `farm::scheduler`), and a lease is persisted as the task's row update in
//! the next batch. No other writer exists to skip, so row locks would add a
//! round trip per lease and no safety: the epoch check is the exclusion.
//!
//! The trait is synchronous (the farm's committer is a thread of its own);
//! the store runs tokio-postgres on a small runtime of its own and waits for
//! it over a channel, so it may be called from any thread, async ones too.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, Pool};

use super::{ArchivedJob, MetaStore, Record, Snapshot, StoreHealth};
use crate::auth::UserRecord;
use crate::digest::Digest;
use crate::error::{Backend, Error, StoreFailure};
use crate::model::job::{Job, JobId};
use crate::model::task::{FrameOutput, Task};
use crate::model::worker::WorkerRecord;
use crate::store::leadership::Lease;

mod migrate;
mod tls;
pub use tls::PgTls;

/// No epoch set: this store does not fence its writes (one coordinator, or tests).
const UNFENCED: i64 = -1;

/// How long one store call may take when not told otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// How long reading the whole state (at a takeover) may take, at least.
const LOAD_DEADLINE: Duration = Duration::from_secs(120);

/// Metadata in a PostgreSQL database. Every call has a deadline: the
/// client gives up after it, and the server cancels a statement that runs
/// longer (`statement_timeout`) and ends a session left idle inside a
/// transaction (`idle_in_transaction_session_timeout`), releasing its locks.
pub struct PgStore {
    shared: Arc<Shared>,
    /// The leadership epoch every batch must still hold, or [`UNFENCED`].
    epoch: i64,
    /// The leadership this handle writes under: calls are refused once it
    /// lapses, and abandoned when it lapses mid-way.
    lease: Option<Lease>,
}

/// What the handles of one store share.
struct Shared {
    pool: Pool,
    /// The runtime tokio-postgres runs on, and the wait for its answers.
    bridge: crate::bridge::Bridge,
    /// Where the database is, for messages (no password).
    target: String,
    /// How long one call may take.
    deadline: Duration,
    health: StoreHealth,
}

/// What to check when PostgreSQL does not answer.
pub(crate) const CHECK_SERVER: &str =
    "check that the PostgreSQL server runs and that this coordinator reaches it, then try again";

/// Whether an error means the server is out of reach (or going away),
/// rather than an answer to the statement.
fn unreachable(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        // Connection exceptions (08), and operator intervention (57):
        // shutting down, starting up, cancelled by statement_timeout.
        Some(db) => matches!(&db.code().code()[..2], "08" | "57"),
        None => true,
    }
}

/// A PostgreSQL error in words: the server's message when it sent one. An
/// unreachable server gives [`Error::StoreUnavailable`], naming PostgreSQL
/// and what to check.
pub(crate) fn pg_error(what: &str, e: tokio_postgres::Error) -> Error {
    if let Some(why) = tls::tls_failure(&e) {
        return Error::StoreUnavailable(format!("{what}: {}", tls_words(&why)));
    }
    let words = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    };
    if unreachable(&e) {
        Error::StoreUnavailable(format!(
            "{what}: PostgreSQL did not answer ({words}); {CHECK_SERVER}"
        ))
    } else {
        failure(format!("{what}: {words}"))
    }
}

/// A PostgreSQL store's failure in words; [`PgStore`]'s calls add the
/// server's address.
pub(crate) fn failure(what: impl Into<String>) -> Error {
    StoreFailure::new(Backend::Postgres { at: None }, what).into()
}

/// `e` naming the server at `at` when it is a PostgreSQL failure that does
/// not name one yet.
pub(crate) fn located(e: Error, at: &str) -> Error {
    match e {
        Error::Store(mut f) if f.backend == (Backend::Postgres { at: None }) => {
            f.backend = Backend::Postgres {
                at: Some(at.to_string()),
            };
            Error::Store(f)
        }
        e => e,
    }
}

/// A failed TLS handshake in words that say what to fix. It counts as the
/// server being out of reach (a certificate may be renewed while the
/// coordinators wait), so a running farm rides it out like any outage and a
/// starting coordinator exits with these words.
fn tls_words(why: &str) -> String {
    format!(
        "TLS to PostgreSQL failed: {why}; with sslmode=verify-full the server's certificate must be signed by the CA in sslrootcert= and name the host the --store URL connects to (a DNS name or IP address in its subjectAltName): fix sslrootcert or the host, or renew the server's certificate"
    )
}

/// Parses a `postgres://` URL into its settings and its TLS (see
/// [`PgTls`]), saying what is wrong with a bad one.
pub fn parse_url(url: &str) -> Result<(tokio_postgres::Config, PgTls), Error> {
    tls::parse(url, &redact(url))
}

/// Opens one connection (not from a pool) with `tls`, its I/O running on
/// a task of the current runtime until the client is dropped.
pub(crate) async fn connect(
    config: &tokio_postgres::Config,
    tls: &PgTls,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    fn drive<F>(connection: F)
    where
        F: Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
    {
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("a PostgreSQL connection ended: {e}");
            }
        });
    }
    match tls {
        PgTls::Off => {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            drive(connection);
            Ok(client)
        }
        PgTls::Verified(make) => {
            let (client, connection) = config.connect(make.clone()).await?;
            drive(connection);
            Ok(client)
        }
    }
}

/// The URL without its password, for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// `PostgreSQL at HOST:PORT/DB`, for messages and the status line.
pub fn describe(url: &str) -> String {
    format!("PostgreSQL at {}", address(url))
}

/// `HOST:PORT/DB` of a store URL: no user, password or options.
pub fn address(url: &str) -> String {
    let shown = redact(url);
    let bare = shown
        .split_once("://")
        .map_or(shown.as_str(), |(_, rest)| rest);
    let bare = bare.rsplit_once('@').map_or(bare, |(_, host)| host);
    bare.split('?').next().unwrap_or(bare).to_string()
}

/// Sets the deadlines and the session's name on a connection's settings:
/// the server enforces them even when this client is cut off.
pub(crate) fn session_settings(
    config: &mut tokio_postgres::Config,
    name: &str,
    deadline: Duration,
) {
    let ms = deadline.as_millis().max(1);
    let mine = format!(
        "-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms} -c lock_timeout={ms}"
    );
    let options = match config.get_options() {
        Some(o) => format!("{o} {mine}"),
        None => mine,
    };
    config
        .options(&options)
        .application_name(name)
        .connect_timeout(deadline)
        .keepalives(true)
        .keepalives_idle(deadline.max(Duration::from_secs(1)));
}

impl PgStore {
    /// Connects to `url` and applies the schema migrations this version
    /// knows that the database lacks; calls have [`DEFAULT_DEADLINE`].
    pub fn open(url: &str) -> Result<Self, Error> {
        Self::open_as(url, "tessera", DEFAULT_DEADLINE)
    }

    /// Like [`PgStore::open`], with sessions named `name` (PostgreSQL's
    /// `application_name`, by which a coordinator taking over finds and
    /// ends a deposed one's sessions) and calls bounded by `deadline`.
    pub fn open_as(url: &str, name: &str, deadline: Duration) -> Result<Self, Error> {
        let (mut config, tls) = parse_url(url)?;
        session_settings(&mut config, name, deadline);
        // Durable before acknowledged, whatever the server's default: set
        // once per connection, at its start.
        let options = format!(
            "{} -c synchronous_commit=on",
            config.get_options().unwrap_or_default()
        );
        config.options(&options);
        let bridge = crate::bridge::Bridge::new("pg", "the PostgreSQL client")?;
        let manager = match tls {
            PgTls::Off => Manager::new(config, tokio_postgres::NoTls),
            PgTls::Verified(make) => Manager::new(config, make),
        };
        let pool = Pool::builder(manager)
            .max_size(8)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(deadline))
            .create_timeout(Some(deadline))
            .recycle_timeout(Some(deadline))
            .build()
            .map_err(|e| {
                located(
                    failure(format!("cannot make a connection pool: {e}")),
                    &address(url),
                )
            })?;
        let store = Self {
            shared: Arc::new(Shared {
                pool,
                bridge,
                target: redact(url),
                deadline,
                health: StoreHealth::new(describe(url)),
            }),
            epoch: UNFENCED,
            lease: None,
        };
        let pool = store.shared.pool.clone();
        let target = store.shared.target.clone();
        store.run("apply the schema migrations", deadline, async move {
            let mut client = Conn::get(&pool, &target).await?;
            migrate::apply(&mut client).await?;
            client.keep();
            Ok(())
        })?;
        Ok(store)
    }

    /// A handle on the same database whose every batch must still hold
    /// leadership `epoch` (see [`crate::ha`]), and which refuses every call
    /// once `lease` lapses.
    pub fn fenced(&self, epoch: i64, lease: Lease) -> PgStore {
        PgStore {
            shared: self.shared.clone(),
            epoch,
            lease: Some(lease),
        }
    }

    /// Whether the database answers (shared with the election's calls).
    pub fn health_handle(&self) -> StoreHealth {
        self.shared.health.clone()
    }

    /// Runs `fut` on the store's runtime and waits for it from any thread,
    /// for at most `deadline` (and never past the lease's end).
    fn run<T: Send + 'static>(
        &self,
        what: &str,
        deadline: Duration,
        fut: impl Future<Output = Result<T, Error>> + Send + 'static,
    ) -> Result<T, Error> {
        if let Some(lease) = &self.lease {
            if !lease.valid() {
                return Err(lapsed(what));
            }
        }
        let lease = self.lease.clone();
        let shared = self.shared.clone();
        let what = what.to_string();
        let answer = self.shared.bridge.run(async move {
            let timed = async {
                match tokio::time::timeout(deadline, fut).await {
                    Ok(r) => r,
                    Err(_) => Err(Error::StoreUnavailable(format!(
                        "cannot {what}: {} did not answer within {}; {CHECK_SERVER}",
                        shared.health_name(),
                        seconds(deadline)
                    ))),
                }
            };
            let r = match &lease {
                Some(l) => tokio::select! {
                    r = timed => r,
                    _ = l.lapsed() => Err(lapsed(&what)),
                },
                None => timed.await,
            };
            match &r {
                Err(Error::StoreUnavailable(m)) => shared.health.failed(m),
                Err(Error::NotActive(_)) => {}
                _ => shared.health.answered(),
            }
            r
        });
        answer
            .unwrap_or_else(|| Err(failure("the PostgreSQL client stopped")))
            .map_err(|e| self.shared.located(e))
    }
}

impl Shared {
    /// `e` naming this store's server, when it is its failure.
    fn located(&self, e: Error) -> Error {
        located(e, &address(&self.target))
    }

    fn health_name(&self) -> String {
        describe(&self.target)
    }
}

/// A duration in words: `3 s`, `1.5 s`.
fn seconds(d: Duration) -> String {
    format!("{} s", (d.as_secs_f64() * 10.0).round() / 10.0)
}

/// The refusal of a call whose leadership lapsed.
fn lapsed(what: &str) -> Error {
    Error::NotActive(format!(
        "cannot {what}: this coordinator's leadership lapsed (PostgreSQL did not confirm it in time), so it no longer acts as the active coordinator; nothing was stored; use the active coordinator, and if none is active, {CHECK_SERVER}"
    ))
}

/// A pooled connection that goes back to the pool only when [`Conn::keep`]
/// says its call finished: one abandoned mid-way (a deadline, an error) may
/// be stuck behind a silent network, so it is closed instead.
struct Conn(Option<deadpool_postgres::Object>, bool);

impl Conn {
    /// A connection, or an error that says where and what to check.
    async fn get(pool: &Pool, target: &str) -> Result<Conn, Error> {
        let object = pool.get().await.map_err(|e| {
            if let deadpool_postgres::PoolError::Backend(b) = &e {
                if let Some(why) = tls::tls_failure(b) {
                    return Error::StoreUnavailable(format!(
                        "cannot connect to PostgreSQL at {target}: {}",
                        tls_words(&why)
                    ));
                }
            }
            let (detail, down) = match &e {
                deadpool_postgres::PoolError::Backend(b) => (
                    match b.as_db_error() {
                        Some(db) => db.message().to_string(),
                        None => format!("{b}"),
                    },
                    unreachable(b),
                ),
                other => (other.to_string(), true),
            };
            let what = format!("cannot connect to PostgreSQL at {target}: {detail}");
            let fix = "check that the server runs and that --store (or $TESSERA_STORE) names its host, port, user and database";
            if down {
                Error::StoreUnavailable(format!("{what}; {fix}"))
            } else {
                StoreFailure::new(Backend::Postgres { at: None }, what)
                    .fix(fix)
                    .into()
            }
        })?;
        Ok(Conn(Some(object), false))
    }

    /// The call finished: the connection may serve the next one.
    fn keep(&mut self) {
        self.1 = true;
    }
}

impl std::ops::Deref for Conn {
    type Target = deadpool_postgres::Object;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("a connection until dropped")
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("a connection until dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let (Some(object), false) = (self.0.take(), self.1) {
            // Out of the pool, and closed.
            drop(deadpool_postgres::Object::take(object));
        }
    }
}

/// A batch as rows: per table, the last value written for each key (None
/// deletes).
#[derive(Default)]
struct Rows {
    jobs: BTreeMap<i64, Option<String>>,
    tasks: BTreeMap<(i64, i32), String>,
    workers: BTreeMap<String, String>,
    users: BTreeMap<String, Option<String>>,
    grants: BTreeSet<(String, String)>,
    archive: BTreeMap<i64, Option<(String, String)>>,
    stitched: BTreeMap<(i64, i32), String>,
    next_job: Option<i64>,
}

// Ids and indexes are stored bit for bit in Postgres's signed integers.
fn id(j: JobId) -> i64 {
    j.0 as i64
}

fn index(i: u32) -> i32 {
    i as i32
}

fn json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String, Error> {
    serde_json::to_string(v).map_err(|e| failure(format!("cannot encode a record: {e}")))
}

/// A stored record that does not parse.
fn corrupt(what: String) -> Error {
    StoreFailure::new(
        Backend::Postgres { at: None },
        format!("corrupt record: {what}"),
    )
    .fix("its records are damaged; restore the database from a backup")
    .into()
}

impl Rows {
    fn of(records: &[Record<'_>]) -> Result<Self, Error> {
        let mut rows = Rows::default();
        for r in records {
            match r {
                Record::Job(j) => {
                    rows.jobs.insert(id(j.id), Some(json(j)?));
                }
                Record::Task(t) => {
                    rows.tasks.insert((id(t.job), index(t.index)), json(t)?);
                }
                Record::Worker(w) => {
                    rows.workers.insert(w.id.0.clone(), json(w)?);
                }
                Record::User(u) => {
                    rows.users.insert(u.name.clone(), Some(json(u)?));
                }
                Record::RemoveUser(name) => {
                    rows.users.insert(name.to_string(), None);
                }
                Record::Grant(user, d) => {
                    rows.grants.insert((user.to_string(), d.to_string()));
                }
                Record::Archive(a) => {
                    let job = id(a.summary.job.id);
                    rows.jobs.insert(job, None);
                    rows.archive
                        .insert(job, Some((json(a)?, json(&a.outputs)?)));
                }
                Record::Delete(j) => {
                    rows.jobs.insert(id(*j), None);
                    rows.archive.insert(id(*j), None);
                    let next = id(*j).saturating_add(1);
                    rows.next_job = Some(rows.next_job.map_or(next, |n| n.max(next)));
                }
                Record::Stitched(j, o) => {
                    rows.stitched.insert((id(*j), index(o.frame)), json(o)?);
                }
            }
        }
        Ok(rows)
    }
}

/// Splits upserts from deletes.
fn split<K: Clone, V: Clone>(m: &BTreeMap<K, Option<V>>) -> (Vec<(K, V)>, Vec<K>) {
    let mut put = Vec::new();
    let mut gone = Vec::new();
    for (k, v) in m {
        match v {
            Some(v) => put.push((k.clone(), v.clone())),
            None => gone.push(k.clone()),
        }
    }
    (put, gone)
}

/// Runs `sql` (a prepared statement, cached per connection) unless `skip`.
async fn exec(
    tx: &deadpool_postgres::Transaction<'_>,
    skip: bool,
    what: &str,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<(), Error> {
    if skip {
        return Ok(());
    }
    let st = tx
        .prepare_cached(sql)
        .await
        .map_err(|err| pg_error(&format!("cannot prepare to {what}"), err))?;
    tx.execute(&st, params)
        .await
        .map_err(|err| pg_error(&format!("cannot {what}"), err))?;
    Ok(())
}

/// Checks inside the batch's transaction that this coordinator is still the
/// active one: the epoch is its own and its lease has not expired on the
/// server's clock (the row lock makes a takeover wait for this batch).
async fn check_epoch(tx: &deadpool_postgres::Transaction<'_>, epoch: i64) -> Result<(), Error> {
    if epoch == UNFENCED {
        return Ok(());
    }
    let st = tx
        .prepare_cached(
            "SELECT epoch, url, expires_at > now() FROM tessera_leader WHERE id = 1 FOR SHARE",
        )
        .await
        .map_err(|err| pg_error("cannot prepare to read the leader row", err))?;
    let row = tx
        .query_one(&st, &[])
        .await
        .map_err(|err| pg_error("cannot read the leader row", err))?;
    let now: i64 = row.get(0);
    if now != epoch {
        let url: String = row.get(1);
        return Err(Error::NotActive(format!(
            "this coordinator is no longer active (another one took over: epoch {now}, at {url}); nothing was written; use the active coordinator"
        )));
    }
    if !row.get::<_, bool>(2) {
        return Err(Error::NotActive(
            "this coordinator's leadership expired on PostgreSQL before it was renewed; nothing was written; use the active coordinator".into(),
        ));
    }
    Ok(())
}

const UPSERT_TASKS: &str = "INSERT INTO tessera_tasks (job, idx, body) \
     SELECT j, i, b::jsonb FROM unnest($1::int8[], $2::int4[], $3::text[]) AS t(j, i, b) \
     ON CONFLICT (job, idx) DO UPDATE SET body = excluded.body";
const UPSERT_STITCHED: &str = "INSERT INTO tessera_stitched (job, frame, body) \
     SELECT j, f, b::jsonb FROM unnest($1::int8[], $2::int4[], $3::text[]) AS t(j, f, b) \
     ON CONFLICT (job, frame) DO UPDATE SET body = excluded.body";
const UPSERT_WORKERS: &str = "INSERT INTO tessera_workers (id, body) \
     SELECT k, b::jsonb FROM unnest($1::text[], $2::text[]) AS t(k, b) \
     ON CONFLICT (id) DO UPDATE SET body = excluded.body";
const UPSERT_USERS: &str = "INSERT INTO tessera_users (name, body) \
     SELECT k, b::jsonb FROM unnest($1::text[], $2::text[]) AS t(k, b) \
     ON CONFLICT (name) DO UPDATE SET body = excluded.body";
const DELETE_USERS: &str = "DELETE FROM tessera_users WHERE name = ANY($1::text[])";
const INSERT_GRANTS: &str = "INSERT INTO tessera_grants (user_name, digest) \
     SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING";
const UPSERT_ARCHIVE: &str = "INSERT INTO tessera_archive (id, body, outputs) \
     SELECT k, b::jsonb, o::jsonb FROM unnest($1::int8[], $2::text[], $3::text[]) AS t(k, b, o) \
     ON CONFLICT (id) DO UPDATE SET body = excluded.body, outputs = excluded.outputs";
const DELETE_ARCHIVE: &str = "DELETE FROM tessera_archive WHERE id = ANY($1::int8[])";
const RAISE_NEXT_JOB: &str = "INSERT INTO tessera_meta (key, value) VALUES ('next_job', $1) \
     ON CONFLICT (key) DO UPDATE SET value = GREATEST(tessera_meta.value, excluded.value)";
const UPSERT_JOBS: &str = "INSERT INTO tessera_jobs (id, body) \
     SELECT k, b::jsonb FROM unnest($1::int8[], $2::text[]) AS t(k, b) \
     ON CONFLICT (id) DO UPDATE SET body = excluded.body";
const DELETE_JOBS: &str = "DELETE FROM tessera_jobs WHERE id = ANY($1::int8[])";

/// Writes `rows` in one transaction, fenced by `epoch` unless [`UNFENCED`].
///
/// The statements are sent together (tokio-postgres pipelines queries that
/// are awaited side by side) and run in order, so a batch costs three round
/// trips: begin, the statements, commit. If the epoch check fails, the
/// transaction is rolled back with whatever ran after it.
async fn write_rows(
    client: &mut deadpool_postgres::Object,
    rows: &Rows,
    epoch: i64,
) -> Result<(), WriteFailure> {
    let tx = client.transaction().await.map_err(WriteFailure::Begin)?;
    let (jobs, gone_jobs) = split(&rows.jobs);
    let (archive, gone_archive) = split(&rows.archive);
    let (users, gone_users) = split(&rows.users);
    let (tj, ti, tb) = unzip3(rows.tasks.iter().map(|((j, i), b)| (*j, *i, b.clone())));
    let (sj, sf, sb) = unzip3(rows.stitched.iter().map(|((j, f), b)| (*j, *f, b.clone())));
    let (wk, wb): (Vec<String>, Vec<String>) = rows.workers.clone().into_iter().unzip();
    let (uk, ub): (Vec<String>, Vec<String>) = users.into_iter().unzip();
    let (gu, gd): (Vec<String>, Vec<String>) = rows.grants.iter().cloned().unzip();
    let (ak, abo): (Vec<i64>, Vec<(String, String)>) = archive.into_iter().unzip();
    let (ab, ao): (Vec<String>, Vec<String>) = abo.into_iter().unzip();
    let (jk, jb): (Vec<i64>, Vec<String>) = jobs.into_iter().unzip();
    let next = rows.next_job.unwrap_or(0);
    let t = &tx;
    use tokio_postgres::types::ToSql;
    // Each statement's parameters, borrowed while the statements run.
    let p0: [&(dyn ToSql + Sync); 3] = [&tj, &ti, &tb];
    let p1: [&(dyn ToSql + Sync); 3] = [&sj, &sf, &sb];
    let p2: [&(dyn ToSql + Sync); 2] = [&wk, &wb];
    let p3: [&(dyn ToSql + Sync); 2] = [&uk, &ub];
    let p4: [&(dyn ToSql + Sync); 1] = [&gone_users];
    let p5: [&(dyn ToSql + Sync); 2] = [&gu, &gd];
    let p6: [&(dyn ToSql + Sync); 3] = [&ak, &ab, &ao];
    let p7: [&(dyn ToSql + Sync); 1] = [&gone_archive];
    let p8: [&(dyn ToSql + Sync); 1] = [&next];
    let p9: [&(dyn ToSql + Sync); 2] = [&jk, &jb];
    let p10: [&(dyn ToSql + Sync); 1] = [&gone_jobs];
    tokio::try_join!(
        check_epoch(t, epoch),
        exec(t, tj.is_empty(), "write tasks", UPSERT_TASKS, &p0),
        exec(
            t,
            sj.is_empty(),
            "write stitched frames",
            UPSERT_STITCHED,
            &p1
        ),
        exec(t, wk.is_empty(), "write workers", UPSERT_WORKERS, &p2),
        exec(t, uk.is_empty(), "write users", UPSERT_USERS, &p3),
        exec(t, gone_users.is_empty(), "remove users", DELETE_USERS, &p4),
        exec(t, gu.is_empty(), "write grants", INSERT_GRANTS, &p5),
        exec(t, ak.is_empty(), "archive jobs", UPSERT_ARCHIVE, &p6),
        exec(
            t,
            gone_archive.is_empty(),
            "delete archived jobs",
            DELETE_ARCHIVE,
            &p7
        ),
        exec(
            t,
            rows.next_job.is_none(),
            "write the next job id",
            RAISE_NEXT_JOB,
            &p8
        ),
        exec(t, jk.is_empty(), "write jobs", UPSERT_JOBS, &p9),
        exec(t, gone_jobs.is_empty(), "delete jobs", DELETE_JOBS, &p10),
    )?;
    tx.commit()
        .await
        .map_err(|err| WriteFailure::Later(pg_error("cannot commit", err)))
}

/// How [`write_rows`] failed.
enum WriteFailure {
    /// At BEGIN: nothing was written.
    Begin(tokio_postgres::Error),
    /// After it (the transaction rolls back unless the commit was sent).
    Later(Error),
}

impl WriteFailure {
    /// Whether the server had ended the connection before BEGIN: a pooled
    /// connection that a standby taking over ended (it ends the old
    /// active's sessions), or that a server restart closed. Nothing was
    /// written, so a fresh connection may try again.
    fn ended_before_begin(&self) -> bool {
        matches!(self, WriteFailure::Begin(e) if e.is_closed()
            || e.code() == Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN))
    }
}

impl From<WriteFailure> for Error {
    fn from(f: WriteFailure) -> Error {
        match f {
            WriteFailure::Begin(err) => pg_error("cannot begin a transaction", err),
            WriteFailure::Later(err) => err,
        }
    }
}

impl From<Error> for WriteFailure {
    fn from(err: Error) -> WriteFailure {
        WriteFailure::Later(err)
    }
}

fn unzip3(it: impl Iterator<Item = (i64, i32, String)>) -> (Vec<i64>, Vec<i32>, Vec<String>) {
    let mut a = Vec::new();
    let mut b = Vec::new();
    let mut c = Vec::new();
    for (x, y, z) in it {
        a.push(x);
        b.push(y);
        c.push(z);
    }
    (a, b, c)
}

fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))
}

/// Reads everything (the body of [`MetaStore::load`]).
async fn load_all(client: &tokio_postgres::Transaction<'_>) -> Result<Snapshot, Error> {
    let q = |what: &'static str| move |err| pg_error(what, err);
    let mut snap = Snapshot::default();
    let rows = client
        .query("SELECT body::text FROM tessera_jobs", &[])
        .await
        .map_err(q("cannot read jobs"))?;
    for r in rows {
        let job: Job = parse(r.get(0))?;
        snap.jobs.insert(job.id, job);
    }
    let rows = client
        .query(
            "SELECT body::text FROM tessera_tasks ORDER BY job, idx",
            &[],
        )
        .await
        .map_err(q("cannot read tasks"))?;
    for r in rows {
        let task: Task = parse(r.get(0))?;
        // Tasks of a job that is gone (archived, deleted) wait to be purged.
        if snap.jobs.contains_key(&task.job) {
            snap.tasks.entry(task.job).or_default().push(task);
        }
    }
    for tasks in snap.tasks.values_mut() {
        tasks.sort_by_key(|t| t.index);
    }
    for r in client
        .query("SELECT body::text FROM tessera_workers", &[])
        .await
        .map_err(q("cannot read workers"))?
    {
        let w: WorkerRecord = parse(r.get(0))?;
        snap.workers.insert(w.id.clone(), w);
    }
    for r in client
        .query("SELECT body::text FROM tessera_users", &[])
        .await
        .map_err(q("cannot read users"))?
    {
        let u: UserRecord = parse(r.get(0))?;
        snap.users.insert(u.name.clone(), u);
    }
    for r in client
        .query("SELECT user_name, digest FROM tessera_grants", &[])
        .await
        .map_err(q("cannot read grants"))?
    {
        let user: String = r.get(0);
        let digest: &str = r.get(1);
        let d: Digest = digest
            .parse()
            .map_err(|_| corrupt(format!("grant digest {digest:?}")))?;
        snap.grants.insert((user, d));
    }
    for r in client
        .query("SELECT body::text FROM tessera_archive", &[])
        .await
        .map_err(q("cannot read archived jobs"))?
    {
        let a: ArchivedJob = parse(r.get(0))?;
        snap.archived.insert(a.summary.job.id, a);
    }
    let next: Option<i64> = client
        .query_opt("SELECT value FROM tessera_meta WHERE key = 'next_job'", &[])
        .await
        .map_err(q("cannot read the next job id"))?
        .map(|r| r.get(0));
    snap.next_job = next.map_or(0, |n| n as u64);
    let mut frames: BTreeMap<JobId, Vec<FrameOutput>> = BTreeMap::new();
    for r in client
        .query(
            "SELECT job, body::text FROM tessera_stitched ORDER BY job, frame",
            &[],
        )
        .await
        .map_err(q("cannot read stitched frames"))?
    {
        let job = JobId(r.get::<_, i64>(0) as u64);
        if snap.jobs.contains_key(&job) {
            frames.entry(job).or_default().push(parse(r.get(1))?);
        }
    }
    for (job, mut list) in frames {
        list.sort_by_key(|o| o.frame);
        if let Some(j) = snap.jobs.get_mut(&job) {
            j.stitched = Arc::new(list);
        }
    }
    Ok(snap)
}

impl MetaStore for PgStore {
    fn load(&self) -> Result<Snapshot, Error> {
        let pool = self.shared.pool.clone();
        let target = self.shared.target.clone();
        let deadline = LOAD_DEADLINE.max(self.shared.deadline);
        let loaded = self.run("read the state", deadline, async move {
            let mut client = Conn::get(&pool, &target).await?;
            // Every table read in one consistent snapshot.
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(|e| pg_error("cannot begin a read", e))?;
            // A large farm's state takes longer to read than one write, and
            // parsing one table's rows leaves the session idle for a while.
            let ms = deadline.as_millis();
            tx.batch_execute(&format!(
                "SET LOCAL statement_timeout = {ms}; SET LOCAL idle_in_transaction_session_timeout = {ms}"
            ))
            .await
            .map_err(|e| pg_error("cannot begin a read", e))?;
            let snap = load_all(&tx).await?;
            tx.commit()
                .await
                .map_err(|e| pg_error("cannot end a read", e))?;
            client.keep();
            Ok(snap)
        });
        if let (Err(e), Some(lease)) = (&loaded, &self.lease) {
            // A coordinator that cannot read its state back (after a failed
            // write, or at a takeover) cannot trust what it holds in memory:
            // it steps down, and reads everything again when it next takes over.
            if lease.valid() {
                tracing::error!("cannot read the state back from PostgreSQL; stepping down: {e}");
            }
            lease.revoke();
        }
        loaded
    }

    fn write(&self, records: &[Record<'_>]) -> Result<(), Error> {
        let rows = Rows::of(records).map_err(|e| self.shared.located(e))?;
        let pool = self.shared.pool.clone();
        let target = self.shared.target.clone();
        let epoch = self.epoch;
        self.run("store a change", self.shared.deadline, async move {
            let mut client = Conn::get(&pool, &target).await?;
            match write_rows(&mut client, &rows, epoch).await {
                // Once, on a fresh connection: so that the answer is the
                // store's (fenced, say), not the ended session's.
                Err(f) if f.ended_before_begin() => {
                    let mut fresh = Conn::get(&pool, &target).await?;
                    write_rows(&mut fresh, &rows, epoch).await?;
                    fresh.keep();
                }
                done => {
                    done?;
                    client.keep();
                }
            }
            Ok(())
        })
    }

    fn load_archived(&self, job: JobId) -> Result<Option<ArchivedJob>, Error> {
        let pool = self.shared.pool.clone();
        let target = self.shared.target.clone();
        self.run("read an archived job", self.shared.deadline, async move {
            let mut client = Conn::get(&pool, &target).await?;
            let row = client
                .query_opt(
                    "SELECT body::text FROM tessera_archive WHERE id = $1",
                    &[&id(job)],
                )
                .await
                .map_err(|e| pg_error("cannot read an archived job", e))?;
            client.keep();
            row.map(|r| parse(r.get(0))).transpose()
        })
    }

    fn archived_outputs(&self, job: JobId) -> Result<Vec<FrameOutput>, Error> {
        let pool = self.shared.pool.clone();
        let target = self.shared.target.clone();
        self.run(
            "read an archived job's outputs",
            self.shared.deadline,
            async move {
                let mut client = Conn::get(&pool, &target).await?;
                let row = client
                    .query_opt(
                        "SELECT outputs::text FROM tessera_archive WHERE id = $1",
                        &[&id(job)],
                    )
                    .await
                    .map_err(|e| pg_error("cannot read an archived job's outputs", e))?;
                client.keep();
                match row {
                    Some(r) => parse(r.get(0)),
                    None => Ok(Vec::new()),
                }
            },
        )
    }

    fn purge_tasks(&self, job: JobId) -> Result<(), Error> {
        let pool = self.shared.pool.clone();
        let target = self.shared.target.clone();
        self.run("purge tasks", self.shared.deadline, async move {
            let mut client = Conn::get(&pool, &target).await?;
            let n = client
                .execute("DELETE FROM tessera_tasks WHERE job = $1", &[&id(job)])
                .await
                .map_err(|e| pg_error("cannot purge tasks", e))?;
            client
                .execute("DELETE FROM tessera_stitched WHERE job = $1", &[&id(job)])
                .await
                .map_err(|e| pg_error("cannot purge stitched frames", e))?;
            client.keep();
            tracing::debug!(job = %job, tasks = n, "task records purged");
            Ok(())
        })
    }

    fn health(&self) -> Option<StoreHealth> {
        Some(self.shared.health.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_the_server_and_never_its_password() {
        let url = "postgres://tessera:s3cret@db.example:5433/farm?sslmode=verify-full";
        assert_eq!(address(url), "db.example:5433/farm");
        let e = located(failure("cannot store a change: disk full"), &address(url));
        let Error::Store(f) = &e else {
            panic!("not a store failure: {e}");
        };
        assert_eq!(
            f.backend,
            Backend::Postgres {
                at: Some("db.example:5433/farm".into())
            }
        );
        let text = e.to_string();
        assert!(
            text.starts_with("the PostgreSQL store at db.example:5433/farm: cannot store a change"),
            "{text}"
        );
        assert!(
            !text.contains("s3cret") && !text.contains("--data"),
            "{text}"
        );
        // A failure that names its server already, and other errors, stay.
        assert_eq!(located(e, "other:5432/x").to_string(), text);
        assert!(matches!(
            located(Error::invalid("bad"), "h:1/d"),
            Error::Invalid(_)
        ));
    }

    #[test]
    fn a_corrupt_record_says_to_restore_the_database() {
        let e = parse::<Job>("{not json").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("PostgreSQL") && text.contains("corrupt record"),
            "{text}"
        );
        assert!(
            text.ends_with("restore the database from a backup"),
            "{text}"
        );
    }
}
