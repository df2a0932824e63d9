//! `tessera doctor` against a real coordinator and the real Blender: a
//! healthy machine passes, and each broken thing gives a FAIL or WARN line
//! that names its fix, with the right exit status.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tessera_tests::*;

/// Runs `tessera doctor ARGS` (wrapped by `wrap`, e.g. prlimit) against
/// `url` with `token` in $TESSERA_TOKEN.
fn doctor(wrap: &[&str], url: &str, token: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(tessera());
            c
        }
        None => Command::new(tessera()),
    };
    cmd.arg("doctor")
        .args(args)
        .env("TESSERA_COORDINATOR", url)
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_CA")
        .env("XDG_CONFIG_HOME", "/nonexistent");
    if let Some(t) = token {
        cmd.env("TESSERA_TOKEN", t);
    }
    let out: Output = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The line of check `what` at `level` (`OK`, `WARN`, `FAIL`), if any.
fn line<'a>(out: &'a str, level: &str, what: &str) -> Option<&'a str> {
    out.lines().find(|l| {
        let mut w = l.split_whitespace();
        w.next() == Some(level) && w.next() == Some(what)
    })
}

fn worker_args(cache: &Path) -> Vec<String> {
    vec![
        "--cache".into(),
        cache.display().to_string(),
        "--blender".into(),
        blender().display().to_string(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A healthy worker machine passes; a wrong token, a missing Blender and an
/// unreachable coordinator each FAIL with their fix; a low open-file limit
/// WARNs without failing.
#[test]
fn doctor_checks_a_worker_machine() {
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let token = worker_token(&coord.url);
    let args = worker_args(&dir.path().join("cache"));
    let args = strs(&args);

    let (ok, out) = doctor(&[], &coord.url, Some(&token), &args);
    assert!(ok, "a healthy machine fails:\n{out}");
    assert!(!out.contains("FAIL"), "{out}");
    for what in ["coordinator", "token", "clock", "blender", "disk"] {
        assert!(line(&out, "OK", what).is_some(), "no OK {what}:\n{out}");
    }
    let b = line(&out, "OK", "blender").unwrap();
    assert!(
        b.contains("Blender 3.") || b.contains("Blender 4.") || b.contains("Blender 5."),
        "{b}"
    );
    assert!(b.contains(&blender().display().to_string()), "{b}");
    assert!(out.contains(" gpu "), "no GPU line:\n{out}");

    let (ok, out) = doctor(&[], &coord.url, Some("not-a-token"), &args);
    assert!(!ok, "a wrong token passes:\n{out}");
    let l = line(&out, "FAIL", "token").unwrap_or_else(|| panic!("no FAIL token:\n{out}"));
    assert!(
        l.contains("tessera users add") && l.contains("--token-file"),
        "{l}"
    );
    assert!(line(&out, "OK", "coordinator").is_some(), "{out}");

    let (ok, out) = doctor(&[], &coord.url, None, &args);
    assert!(!ok, "no token passes:\n{out}");
    assert!(
        line(&out, "FAIL", "token").is_some_and(|l| l.contains("TESSERA_TOKEN")),
        "{out}"
    );

    let mut missing = args.clone();
    missing.extend(["--blender", "/nonexistent/blender"]);
    let (ok, out) = doctor(&[], &coord.url, Some(&token), &missing);
    assert!(!ok, "a missing Blender passes:\n{out}");
    let l = line(&out, "FAIL", "blender").unwrap_or_else(|| panic!("no FAIL blender:\n{out}"));
    assert!(
        l.contains("/nonexistent/blender") && l.contains("install Blender"),
        "{l}"
    );
    // The Blender that is there still gets its OK.
    assert!(line(&out, "OK", "blender").is_some(), "{out}");

    let (ok, out) = doctor(
        &["prlimit", "--nofile=256"],
        &coord.url,
        Some(&token),
        &args,
    );
    assert!(ok, "a low open-file limit alone fails the machine:\n{out}");
    let l = line(&out, "WARN", "files").unwrap_or_else(|| panic!("no WARN files:\n{out}"));
    assert!(l.contains("256") && l.contains("LimitNOFILE"), "{l}");

    let url = coord.url.clone();
    drop(coord);
    let (ok, out) = doctor(&[], &url, Some(&token), &args);
    assert!(!ok, "an unreachable coordinator passes:\n{out}");
    let l =
        line(&out, "FAIL", "coordinator").unwrap_or_else(|| panic!("no FAIL coordinator:\n{out}"));
    assert!(l.contains(&url) && l.contains("--coordinator"), "{l}");
    // The machine's own checks still run.
    assert!(line(&out, "OK", "blender").is_some(), "{out}");
}

/// A self-signed certificate for localhost valid `days` days, and its key.
fn certificate(dir: &Path, name: &str, days: u32) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
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
            &days.to_string(),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ],
    );
    (cert, key)
}

/// Over TLS: trusted with --ca it passes; without the CA it FAILs naming --ca.
#[test]
fn doctor_checks_tls_to_the_coordinator() {
    let dir = scratch();
    let (cert, key) = certificate(dir.path(), "server", 400);
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--tls-cert", c, "--tls-key", k, "--tls-ca-for-tests", c],
    );
    let token = worker_token(&coord.url);
    let args = worker_args(&dir.path().join("cache"));
    let mut with_ca = strs(&args);
    with_ca.extend(["--ca", c]);
    let (ok, out) = doctor(&[], &coord.url, Some(&token), &with_ca);
    assert!(ok, "{out}");
    assert!(line(&out, "OK", "tls").is_some(), "{out}");
    let (ok, out) = doctor(&[], &coord.url, Some(&token), &strs(&args));
    assert!(!ok, "an untrusted certificate passes:\n{out}");
    let l = line(&out, "FAIL", "coordinator").unwrap_or_else(|| panic!("{out}"));
    assert!(l.contains("--ca"), "{l}");
}

/// `doctor coordinator`: the data dir of a running coordinator passes (its
/// store is in use), a certificate near its end and a missing ffmpeg WARN,
/// an unwritable data dir FAILs.
#[test]
fn doctor_checks_a_coordinator_machine() {
    let dir = scratch();
    let data = dir.path().join("data");
    let coord = Coordinator::start(&data, "127.0.0.1:0", &[]);
    let (long, _) = certificate(dir.path(), "long", 400);
    let (short, _) = certificate(dir.path(), "short", 5);
    let d = data.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["coordinator", "--data", d];
        args.extend(extra);
        doctor(&[], &coord.url, None, &args)
    };
    let (ok, out) = run(&["--tls-cert", long.to_str().unwrap()]);
    assert!(ok, "{out}");
    for what in ["data", "store", "blobs", "tls"] {
        assert!(line(&out, "OK", what).is_some(), "no OK {what}:\n{out}");
    }
    assert!(
        line(&out, "OK", "store")
            .unwrap()
            .contains("in use by a running coordinator"),
        "{out}"
    );
    assert!(
        line(&out, "OK", "tls")
            .unwrap()
            .contains("valid for 399 more days"),
        "{out}"
    );

    let (ok, out) = run(&["--tls-cert", short.to_str().unwrap()]);
    assert!(ok, "a certificate that is still valid fails:\n{out}");
    let l = line(&out, "WARN", "tls").unwrap_or_else(|| panic!("{out}"));
    assert!(
        l.contains("expires in 4 days") && l.contains("renew"),
        "{l}"
    );

    let (ok, out) = run(&["--ffmpeg", "/nonexistent/ffmpeg"]);
    assert!(ok, "{out}");
    assert!(
        line(&out, "WARN", "ffmpeg").is_some_and(|l| l.contains("apt-get install ffmpeg")),
        "{out}"
    );

    // A file where the data directory should be.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let (ok, out) = doctor(
        &[],
        &coord.url,
        None,
        &["coordinator", "--data", file.to_str().unwrap()],
    );
    assert!(!ok, "an unwritable data dir passes:\n{out}");
    assert!(
        line(&out, "FAIL", "data").is_some_and(|l| l.contains("chown")),
        "{out}"
    );
}
