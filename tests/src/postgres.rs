//! A real PostgreSQL server for tests: `initdb` in a temporary directory,
//! run as an unprivileged user (PostgreSQL refuses root), listening on a
//! free loopback port with its unix socket in the same directory. Stopped
//! when dropped.
//!
//! Debian's `postgresql` package provides the binaries
//! (`/usr/lib/postgresql/VERSION/bin`); `scripts/lib.sh`'s
//! `ensure_postgres` installs it. Tests that need a server call
//! [`PgServer::start_or_skip`]: without one they print why and skip, unless
//! `TESSERA_REQUIRE_SERVERS=1` (set by `scripts/test.sh` once it has
//! installed the server), where they fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running PostgreSQL server.
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// The unprivileged user the server runs as, when we are root.
    run_as: Option<String>,
}

/// The superuser `initdb` creates (trust authentication on loopback).
const USER: &str = "tessera";

/// Where the server's binaries are: `$TESSERA_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`, else `$PATH`.
fn bin_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("TESSERA_PG_BIN") {
        let d = PathBuf::from(d);
        if !d.join("initdb").is_file() {
            return Err(format!(
                "TESSERA_PG_BIN={} holds no initdb; point it at PostgreSQL's bin directory",
                d.display()
            ));
        }
        return Ok(d);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Ok(bin);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
            return Ok(dir);
        }
    }
    Err("PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin or $PATH); install it with `apt-get install postgresql` or run scripts/test.sh".into())
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn show(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl PgServer {
    /// Starts a fresh server, or says why it cannot.
    pub fn start() -> Result<PgServer, String> {
        let bin = bin_dir()?;
        let run_as = if euid() == 0 {
            Some(
                ["postgres", "nobody"]
                    .into_iter()
                    .find(|u| user_exists(u))
                    .ok_or("running as root and neither `postgres` nor `nobody` exists to run PostgreSQL as")?
                    .to_string(),
            )
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("tessera-pg-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        if let Some(user) = &run_as {
            let out = Command::new("chown")
                .arg(user)
                .arg(dir.path())
                .output()
                .map_err(|e| format!("cannot run chown: {e}"))?;
            if !out.status.success() {
                return Err(format!("chown {user} failed: {}", show(&out)));
            }
        }
        let mut server = PgServer {
            dir,
            bin,
            port: 0,
            run_as,
        };
        let data = server.data();
        let out = server
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!("initdb failed: {}", show(&out)));
        }
        let mut last = String::new();
        for _ in 0..3 {
            server.port = free_port()?;
            let opts = server.options();
            let out = server
                .command("pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(server.dir.path().join("server.log"))
                .args(["-o", &opts, "-w", "-t", "60", "start"])
                .output()
                .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
            if out.status.success() {
                server.create_db("tessera")?;
                return Ok(server);
            }
            last = format!(
                "pg_ctl start failed: {}\n{}",
                show(&out),
                std::fs::read_to_string(server.dir.path().join("server.log")).unwrap_or_default()
            );
        }
        Err(last)
    }

    /// Starts a server, or prints why not and returns None; with
    /// `TESSERA_REQUIRE_SERVERS=1` a server that cannot start fails the test.
    pub fn start_or_skip(test: &str) -> Option<PgServer> {
        match PgServer::start() {
            Ok(s) => Some(s),
            Err(e) if std::env::var("TESSERA_REQUIRE_SERVERS").as_deref() == Ok("1") => {
                panic!(
                    "{test}: PostgreSQL must run (TESSERA_REQUIRE_SERVERS=1) but cannot start: {e}"
                )
            }
            Err(e) => {
                eprintln!("skipped {test}: no PostgreSQL server: {e}");
                None
            }
        }
    }

    /// `postgres://tessera@127.0.0.1:PORT/tessera`.
    pub fn url(&self) -> String {
        self.url_for("tessera")
    }

    /// The URL of database `db` on this server.
    pub fn url_for(&self, db: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{db}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates database `name` (dropping one of that name first).
    pub fn create_db(&self, name: &str) -> Result<(), String> {
        self.psql("postgres", &format!("DROP DATABASE IF EXISTS \"{name}\""))?;
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""))?;
        Ok(())
    }

    /// Runs `sql` in database `db` with `psql`; returns its unaligned output.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .args(["-d", db, "-c", sql])
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if !out.status.success() {
            return Err(format!("psql `{sql}` failed: {}", show(&out)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command of the server's, run as its user.
    fn command(&self, program: &str) -> Command {
        let exe = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(exe);
                c.current_dir(self.dir.path());
                c
            }
            None => Command::new(exe),
        }
    }

    /// Stops the server with `pg_ctl stop -m MODE` (`fast`: sessions are
    /// ended, `immediate`: no shutdown checkpoint, crash recovery at the
    /// next start); the port and data stay for [`PgServer::start_again`].
    pub fn stop(&self, mode: &str) -> Result<(), String> {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", mode, "-w", "-t", "60", "stop"])
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!("pg_ctl stop -m {mode} failed: {}", show(&out)));
        }
        Ok(())
    }

    /// The server's options: its port and socket directory.
    fn options(&self) -> String {
        // fsync off: the tests kill coordinators, never this server's
        // machine, so its WAL flushes would only cost time.
        format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        )
    }

    /// Starts a stopped server again on its port, with its data.
    pub fn start_again(&self) -> Result<(), String> {
        let opts = self.options();
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-o", &opts, "-w", "-t", "60", "start"])
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl start failed: {}\n{}",
                show(&out),
                self.log()
            ));
        }
        Ok(())
    }

    /// Turns TLS on (`ssl=on` with `cert` and `key`, PEM files) and restarts
    /// the server so that it takes them. Plain connections keep working.
    pub fn enable_ssl(&self, cert: &Path, key: &Path) -> Result<(), String> {
        let data = self.data();
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            let dest = data.join(to);
            std::fs::copy(from, &dest).map_err(|e| format!("cannot copy {to}: {e}"))?;
            if let Some(user) = &self.run_as {
                let out = Command::new("chown")
                    .arg(user)
                    .arg(&dest)
                    .output()
                    .map_err(|e| format!("cannot run chown: {e}"))?;
                if !out.status.success() {
                    return Err(format!("chown {user} failed: {}", show(&out)));
                }
            }
            // PostgreSQL refuses a key that others may read.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("cannot chmod {to}: {e}"))?;
        }
        let conf = "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n";
        let mut text = std::fs::read_to_string(data.join("postgresql.conf"))
            .map_err(|e| format!("cannot read postgresql.conf: {e}"))?;
        text.push_str(conf);
        std::fs::write(data.join("postgresql.conf"), text)
            .map_err(|e| format!("cannot write postgresql.conf: {e}"))?;
        self.restart("fast")
    }

    /// `pg_ctl restart -m MODE`: down and up again at once.
    pub fn restart(&self, mode: &str) -> Result<(), String> {
        self.stop(mode)?;
        self.start_again()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The directory it lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg("-u")
        .arg(name)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The effective user id, read from `/proc` (no `unsafe` for `geteuid`).
fn euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

/// A coordinator process on a PostgreSQL store, active or standby, whose
/// standard output is collected line by line.
pub struct PgCoordinator {
    /// The process.
    pub proc: crate::Proc,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `http://127.0.0.1:PORT/metrics`.
    pub metrics: String,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl PgCoordinator {
    /// Starts `tessera coordinator --store STORE --blobs BLOBS --http` on
    /// `listen` over `data` (`BLOBS`: a directory or `s3://bucket/prefix`,
    /// with `env` saying how to reach the S3 server), and waits until it
    /// listens (active or standby).
    pub fn start(
        data: &Path,
        listen: &str,
        store: &str,
        blobs: &str,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        let mut cmd = Command::new(crate::tessera());
        cmd.args(["coordinator", "--listen", listen, "--http", "127.0.0.1:0"]);
        Self::spawn(cmd, data, store, blobs, extra, env)
    }

    /// [`PgCoordinator::start`] inside the network namespace `ns`, listening
    /// (gRPC and HTTP, plain text: the link is the test's own) on its
    /// address, where the host reaches it.
    pub fn start_in(
        ns: &crate::netns::NetNs,
        data: &Path,
        store: &str,
        blobs: &str,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        let mut cmd = ns.command(crate::tessera());
        let on = format!("{}:0", ns.ns_ip());
        cmd.args([
            "coordinator",
            "--listen",
            &on,
            "--http",
            &on,
            "--allow-plaintext",
        ]);
        Self::spawn(cmd, data, store, blobs, extra, env)
    }

    /// Runs `cmd` (`tessera coordinator` with its addresses) on the store.
    fn spawn(
        mut cmd: Command,
        data: &Path,
        store: &str,
        blobs: &str,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        use std::io::BufRead;
        std::fs::create_dir_all(data).unwrap();
        let log = data.join(format!(
            "coordinator-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut child = cmd
            .arg("--data")
            .arg(data)
            .args(["--store", store])
            .arg("--blobs")
            .arg(blobs)
            .args(extra)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("tessera coordinator listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "coordinator did not start: {line:?}\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
            .to_string();
        let mut m = String::new();
        reader.read_line(&mut m).unwrap();
        let metrics = m
            .trim()
            .trim_start_matches("tessera coordinator metrics on ")
            .to_string();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for l in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        Self {
            proc: crate::Proc { child, log },
            url: format!("http://{addr}"),
            addr,
            metrics,
            lines,
        }
    }

    /// Waits up to `timeout` for an output line containing `what`; returns it.
    pub fn wait_line(&self, what: &str, timeout: std::time::Duration) -> Option<String> {
        let start = std::time::Instant::now();
        loop {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| l.contains(what)) {
                return Some(l.clone());
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Its output lines after the listening ones.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}
