//! TLS to PostgreSQL: `postgres://…?sslmode=verify-full&sslrootcert=/path/ca.pem`.
//!
//! libpq's words, so a URL that works with `psql` works here: `verify-full`
//! encrypts and checks that the server's certificate is signed by the CA in
//! `sslrootcert` (a PEM file, one or more certificates) and names the host
//! the URL connects to. `disable` (and `prefer`, tokio-postgres's default,
//! which falls back to plain text here) connect without TLS, as before.
//! `require` and `verify-ca`, which would accept a server that is not the
//! one named, are refused with the fix: Tessera verifies whom it talks to,
//! as its gRPC and HTTPS clients do. The stack is rustls with the ring
//! provider, the one the rest of the farm uses.

use std::sync::Arc;

use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_rustls::rustls;

use crate::error::Error;

/// How connections to PostgreSQL are made: plain, or TLS verified against a CA.
#[derive(Clone)]
pub enum PgTls {
    /// No TLS (`sslmode=disable`, or none given).
    Off,
    /// TLS with the server's certificate and name checked (`verify-full`).
    Verified(MakeRustlsConnect),
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PgTls::Off => "PgTls::Off",
            PgTls::Verified(_) => "PgTls::Verified",
        })
    }
}

/// Splits a PostgreSQL URL into tokio-postgres's settings and the TLS to
/// connect with; the `sslmode` and `sslrootcert` parameters are read here
/// (tokio-postgres knows neither `verify-full` nor `sslrootcert`).
pub fn parse(url: &str, shown: &str) -> Result<(tokio_postgres::Config, PgTls), Error> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut mode = None;
    let mut root = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => mode = Some(value.to_string()),
            "sslrootcert" => root = Some(percent_decode(value)),
            _ => rest.push(pair),
        }
    }
    let plain = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config = plain.parse::<tokio_postgres::Config>().map_err(|e| {
        Error::invalid(format!(
            "--store {shown}: not a PostgreSQL URL ({e}); use postgres://USER@HOST:PORT/DATABASE"
        ))
    })?;
    let fix = "use sslmode=verify-full&sslrootcert=/path/to/ca.pem (the CA that signed the server's certificate), or sslmode=disable on a trusted network";
    let tls = match (mode.as_deref(), &root) {
        (Some("verify-full"), Some(root)) => {
            config.ssl_mode(SslMode::Require);
            PgTls::Verified(connector(root, shown)?)
        }
        (Some("verify-full"), None) => {
            return Err(Error::invalid(format!(
                "--store {shown}: sslmode=verify-full needs sslrootcert=/path/to/ca.pem, the CA that signed the server's certificate"
            )))
        }
        (Some(m @ ("require" | "verify-ca")), _) => {
            return Err(Error::invalid(format!(
                "--store {shown}: sslmode={m} would accept a server whose certificate does not name the host; {fix}"
            )))
        }
        (Some("disable") | None, None) => {
            config.ssl_mode(SslMode::Disable);
            PgTls::Off
        }
        (Some("prefer"), None) => PgTls::Off,
        (Some("disable" | "prefer") | None, Some(_)) => {
            return Err(Error::invalid(format!(
                "--store {shown}: sslrootcert is given but sslmode is {}, which does not check the certificate; add sslmode=verify-full",
                mode.as_deref().unwrap_or("not set")
            )))
        }
        (Some(m), _) => {
            return Err(Error::invalid(format!(
                "--store {shown}: sslmode={m} is not a mode; {fix}"
            )))
        }
    };
    Ok((config, tls))
}

/// A rustls client that trusts only the certificates in the PEM file `root`.
fn connector(root: &str, shown: &str) -> Result<MakeRustlsConnect, Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let cant = |why: String| {
        Error::invalid(format!(
            "--store {shown}: cannot use sslrootcert={root}: {why}; give the PEM file of the CA that signed the PostgreSQL server's certificate"
        ))
    };
    let pem = std::fs::read(root).map_err(|e| cant(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| cant(format!("not PEM ({e})")))?;
        roots
            .add(cert)
            .map_err(|e| cant(format!("not a usable certificate ({e})")))?;
    }
    if roots.is_empty() {
        return Err(cant("it holds no certificate".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| cant(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// `%2F` and the like in a URL parameter, as libpq decodes them.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Why a TLS handshake failed, when `e` is a TLS failure: rustls's words
/// (an unknown issuer, a certificate for another name), for a message that
/// says what to fix.
pub fn tls_failure(e: &tokio_postgres::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut tls = false;
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if let Some(r) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(r.to_string());
            }
        }
        tls |= s.to_string().contains("TLS");
        source = s.source();
    }
    // A server without TLS answers the request with a plain "no".
    tls.then(|| {
        let mut words = Vec::new();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(s) = source {
            words.push(s.to_string());
            source = s.source();
        }
        words.join(": ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_libpqs_and_the_unsafe_ones_are_refused_with_the_fix() {
        let (c, tls) = parse("postgres://u@db:5432/farm", "x").unwrap();
        assert!(matches!(tls, PgTls::Off));
        assert_eq!(c.get_dbname(), Some("farm"));
        let (c, tls) = parse(
            "postgres://u@db/farm?sslmode=disable&application_name=a",
            "x",
        )
        .unwrap();
        assert!(matches!(tls, PgTls::Off));
        assert_eq!(c.get_application_name(), Some("a"));
        for (url, words) in [
            (
                "postgres://u@db/farm?sslmode=verify-full",
                "needs sslrootcert",
            ),
            (
                "postgres://u@db/farm?sslmode=require",
                "sslmode=verify-full",
            ),
            (
                "postgres://u@db/farm?sslmode=verify-ca",
                "does not name the host",
            ),
            (
                "postgres://u@db/farm?sslrootcert=/ca.pem",
                "add sslmode=verify-full",
            ),
            ("postgres://u@db/farm?sslmode=nope", "not a mode"),
            (
                "postgres://u@db/farm?sslmode=verify-full&sslrootcert=/no/such/ca.pem",
                "cannot use sslrootcert=/no/such/ca.pem",
            ),
        ] {
            let e = parse(url, "x").unwrap_err().to_string();
            assert!(e.contains(words), "{url}: {e}");
        }
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let url = format!(
            "postgres://u@db/farm?sslmode=verify-full&sslrootcert={}",
            ca.display()
        );
        let e = parse(&url, "x").unwrap_err().to_string();
        assert!(e.contains("holds no certificate"), "{e}");
    }

    #[test]
    fn parameters_are_percent_decoded() {
        assert_eq!(percent_decode("%2Fetc%2Fca.pem"), "/etc/ca.pem");
        assert_eq!(percent_decode("a%zz"), "a%zz");
    }
}
