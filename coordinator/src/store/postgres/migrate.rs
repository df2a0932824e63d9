//! Versioned schema migrations, applied at start.
//!
//! The migrations are SQL files embedded in the binary
//! (`store/migrations/NNN_name.sql`), applied in order, each in a
//! transaction with its row in `tessera_migrations`. Coordinators starting
//! together take a transaction-scoped advisory lock first, so each
//! migration runs once. A dozen lines do what refinery would, without its
//! crates and conventions.

use crate::error::{Backend, Error, StoreFailure};

use super::pg_error;

/// Every migration this version knows: (version, name, SQL), in order.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "initial", include_str!("../migrations/001_initial.sql")),
    (
        2,
        "leader lease",
        include_str!("../migrations/002_leader_lease.sql"),
    ),
];

/// The advisory lock key that serialises migrations ("tessmigr").
const LOCK: i64 = 0x7465_7373_6d69_6772;

/// The newest schema version this coordinator knows.
pub fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// Applies the migrations the database lacks; refuses a database migrated
/// by a newer version.
pub async fn apply(client: &mut deadpool_postgres::Object) -> Result<(), Error> {
    let e = |what: &'static str| move |err| pg_error(what, err);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS tessera_migrations (
                version    integer PRIMARY KEY,
                name       text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )",
        )
        .await
        .or_else(|err| {
            // Two coordinators creating it at once: one wins, which is fine.
            if err.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
                Ok(())
            } else {
                Err(err)
            }
        })
        .map_err(e("cannot create the migrations table"))?;
    let tx = client
        .transaction()
        .await
        .map_err(e("cannot begin the migrations"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .await
        .map_err(e("cannot lock the migrations"))?;
    let done: Vec<i32> = tx
        .query(
            "SELECT version FROM tessera_migrations ORDER BY version",
            &[],
        )
        .await
        .map_err(e("cannot read the migrations table"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if let Some(newest) = done.iter().max().filter(|v| **v > latest()) {
        return Err(StoreFailure::new(
            Backend::Postgres { at: None },
            format!(
                "the database's schema is version {newest}, from a newer Tessera than this one (which knows up to {})",
                latest()
            ),
        )
        .fix("upgrade this coordinator")
        .into());
    }
    for (version, name, sql) in MIGRATIONS {
        if done.contains(version) {
            continue;
        }
        tx.batch_execute(sql)
            .await
            .map_err(|err| pg_error(&format!("migration {version} ({name}) failed"), err))?;
        tx.execute(
            "INSERT INTO tessera_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .map_err(e("cannot record a migration"))?;
        tracing::info!(version, name, "schema migration applied");
    }
    tx.commit().await.map_err(e("cannot commit the migrations"))
}
