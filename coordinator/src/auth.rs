//! Who may do what: bearer tokens for users, workers and admins.
//!
//! A token is 32 random bytes in hex behind a `tsr_` prefix; the coordinator
//! stores only its blake3 hash. Roles:
//! - `admin` manages users and sees every job;
//! - `user` submits jobs and sees only its own;
//! - `worker` lets a machine join the farm (the `Work` service) and move blobs.

use std::io::Read;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Everything.
    Admin,
    /// Own jobs.
    User,
    /// Render for the farm.
    Worker,
    /// Read `/metrics`, every job's series included (Prometheus), and
    /// nothing else: no jobs, no blobs, no worker calls.
    Metrics,
}

impl Role {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::User => "user",
            Self::Worker => "worker",
            Self::Metrics => "metrics",
        }
    }

    /// Parses `admin`, `user`, `worker` or `metrics`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "admin" => Ok(Self::Admin),
            "user" => Ok(Self::User),
            "worker" => Ok(Self::Worker),
            "metrics" => Ok(Self::Metrics),
            other => Err(Error::invalid(format!(
                "`{other}` is not a role; use user, worker, metrics or admin"
            ))),
        }
    }
}

/// A named token holder, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    /// Unique name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// blake3 of the token, hex.
    pub token_hash: String,
    /// When it was created (ms since the epoch).
    pub created_ms: u64,
}

/// The caller of a request, once its token checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user's name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

impl Identity {
    /// The identity of every request when authentication is off.
    pub fn local() -> Self {
        Self {
            name: "local".into(),
            role: Role::Admin,
        }
    }

    /// Whether it may see and manage everything.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether `/metrics` shows it every job's series (an admin, or the
    /// `metrics` role that Prometheus scrapes with).
    pub fn sees_all_metrics(&self) -> bool {
        matches!(self.role, Role::Admin | Role::Metrics)
    }

    /// Whether it may see or change a job owned by `owner`.
    pub fn may_see(&self, owner: &str) -> bool {
        self.is_admin() || self.name == owner
    }
}

/// A fresh token.
pub fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io("cannot read random bytes for a token".into(), e))?;
    Ok(format!(
        "tsr_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// The stored form of a token.
pub fn token_hash(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

/// Checks a user name: short, plain, never a path.
pub fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "`{name}` is not a user name; use up to 64 letters, digits, `-`, `_` or `.`"
        )))
    }
}

/// The token from an `authorization: Bearer ...` value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let v = header?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_hashed() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert!(a.starts_with("tsr_") && a.len() == 68 && a != b);
        assert_eq!(token_hash(&a), token_hash(&a));
        assert_ne!(token_hash(&a), token_hash(&b));
    }

    #[test]
    fn names_and_headers() {
        assert!(check_name("alice-1.b_c").is_ok());
        for bad in ["", "../x", "a/b", ".hidden", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(bearer(Some("Bearer tsr_1")), Some("tsr_1"));
        assert_eq!(bearer(Some("bearer  tsr_1 ")), Some("tsr_1"));
        assert_eq!(bearer(Some("Basic x")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn visibility() {
        let alice = Identity {
            name: "alice".into(),
            role: Role::User,
        };
        assert!(alice.may_see("alice") && !alice.may_see("bob"));
        assert!(Identity::local().may_see("bob"));
    }
}
