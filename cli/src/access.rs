//! How the CLI reaches a coordinator: its address, token and CA from the
//! command line, the environment and the user's token file, and a worker's
//! token file. Knows nothing of the commands that use them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tessera_worker::connect::Access;

/// Where the CLI looks for a token when neither --token nor $TESSERA_TOKEN is set.
pub fn token_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("tessera").join("token"))
}

/// The coordinator's address, token and CA from the command line, the
/// environment and the config file.
pub fn access(url: &str, token: Option<String>, ca: Option<&Path>) -> Result<Access> {
    let token = token.filter(|t| !t.trim().is_empty()).or_else(|| {
        let path = token_file()?;
        let t = std::fs::read_to_string(path).ok()?;
        Some(t.trim().to_string()).filter(|t| !t.is_empty())
    });
    let ca = match ca {
        Some(p) => Some(
            std::fs::read(p)
                .with_context(|| format!("cannot read the CA certificate {}", p.display()))?,
        ),
        None => None,
    };
    Ok(Access {
        url: url.to_string(),
        token,
        ca,
    })
}

/// Whether `--token` was given as an argument rather than by the environment
/// or a file.
pub fn token_on_command_line() -> bool {
    std::env::args().any(|a| a == "--token" || a.starts_with("--token="))
}

/// Reads a worker token from `path` (`-`: standard input).
pub fn read_token_file(path: &Path) -> Result<String> {
    let text = if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .context("cannot read the token from standard input")?;
        s
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?
    };
    let token = text.trim().to_string();
    if token.is_empty() {
        bail!(
            "the token file {} is empty; put a worker token in it (`tessera users add NAME --role worker` prints one)",
            path.display()
        );
    }
    Ok(token)
}
