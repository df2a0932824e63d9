//! Config files for `tessera coordinator` and `tessera worker`.
//!
//! A file's keys are the flags' long names (`lease-ttl = 30`; `lease_ttl`
//! is read the same). Rather than a second, serde-shaped copy of every
//! option, the file is turned into the arguments clap parses: each option is
//! declared once, in `main.rs`, and a new flag is a new key with no further
//! work. Precedence: a flag, then its environment variable, then the file,
//! then the default. Each key is checked against its flag's own parser before
//! anything starts, so a wrong value names the file's line.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use crate::Cli;

/// The subcommands that read `--config`.
const ROLES: [&str; 2] = ["coordinator", "worker"];

/// Options that are actions or secrets, never file keys.
const NOT_KEYS: [&str; 4] = ["help", "version", "config", "status"];

/// Where one option's value came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// The command line.
    Flag,
    /// An environment variable.
    Env(String),
    /// The config file, at this line.
    File(PathBuf, usize),
    /// The built-in default.
    Default,
    /// Not set anywhere.
    Unset,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag => write!(f, "flag"),
            Source::Env(v) => write!(f, "env ${v}"),
            Source::File(p, line) => write!(f, "file {}:{line}", p.display()),
            Source::Default => write!(f, "default"),
            Source::Unset => write!(f, "unset"),
        }
    }
}

/// One key of a config file, checked, as the arguments it stands for.
#[derive(Debug)]
struct Entry {
    id: String,
    line: usize,
    args: Vec<OsString>,
}

/// Parses the command line, merging in the `--config` file of `coordinator`
/// and `worker`. Clap's own errors (and `--help`) exit as `Cli::parse` does.
pub fn parse(argv: Vec<OsString>) -> Result<Cli> {
    Ok(merge(argv)?.0)
}

/// The parsed command line, its matches, and which options the file set.
fn merge(argv: Vec<OsString>) -> Result<(Cli, ArgMatches, BTreeMap<String, Source>)> {
    let mut cmd = Cli::command();
    cmd.build();
    let matches = cmd.clone().get_matches_from(&argv);
    let mut from_file = BTreeMap::new();
    let Some((role, sub)) = matches.subcommand() else {
        return Ok((from(&matches), matches, from_file));
    };
    if !ROLES.contains(&role) {
        return Ok((from(&matches), matches, from_file));
    }
    let Some(path) = sub.get_one::<PathBuf>("config") else {
        return Ok((from(&matches), matches, from_file));
    };
    let path = path.clone();
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read the config file {}; check the path given to --config",
            path.display()
        )
    })?;
    let sub_cmd = cmd.find_subcommand(role).expect("a known subcommand");
    let entries = read(&text, &path, sub_cmd)?;
    let mut argv = argv;
    for e in entries {
        // A flag or its environment variable wins over the file.
        if matches!(
            sub.value_source(&e.id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        argv.extend(e.args);
        from_file.insert(e.id, Source::File(path.clone(), e.line));
    }
    let matches = cmd.get_matches_from(&argv);
    Ok((from(&matches), matches, from_file))
}

fn from(matches: &ArgMatches) -> Cli {
    Cli::from_arg_matches(matches).unwrap_or_else(|e| e.exit())
}

/// The options a role's file may set: long name -> argument.
fn keys(sub_cmd: &clap::Command) -> BTreeMap<String, &clap::Arg> {
    sub_cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional())
        .filter_map(|a| Some((a.get_long()?.to_string(), a)))
        .filter(|(long, _)| !NOT_KEYS.contains(&long.as_str()))
        .collect()
}

/// Whether an argument's values are numbers (so a TOML string is a mistake).
fn numeric(arg: &clap::Arg) -> bool {
    use std::any::TypeId;
    let id = arg.get_value_parser().type_id();
    [
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<f64>(),
    ]
    .iter()
    .any(|t| id == *t)
}

/// Reads and checks a config file against a role's options.
fn read(text: &str, path: &Path, sub_cmd: &clap::Command) -> Result<Vec<Entry>> {
    use toml::de::{DeTable, DeValue};
    let table = DeTable::parse(text).map_err(|e| {
        anyhow::anyhow!(
            "{} is not valid TOML: {}",
            path.display(),
            e.to_string().trim_end()
        )
    })?;
    let keys = keys(sub_cmd);
    let valid = || {
        let names: Vec<&str> = keys
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "token")
            .collect();
        names.join(", ")
    };
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut out = Vec::new();
    let mut seen = BTreeMap::new();
    for (key, value) in table.get_ref().iter() {
        let line = line_of(key.span().start);
        let at = format!("{}:{line}", path.display());
        let name = key.get_ref().replace('_', "-");
        if name == "token" {
            bail!("{at}: a token cannot be written in a config file; put it in a file only the service can read and give its path: token-file = \"/etc/tessera/worker.token\"");
        }
        let Some(arg) = keys.get(&name) else {
            bail!(
                "{at}: unknown key `{}` for `tessera {}`; valid keys: {}",
                key.get_ref(),
                sub_cmd.get_name(),
                valid()
            );
        };
        if let Some(first) = seen.insert(name.clone(), line) {
            bail!("{at}: `{name}` is set twice (first at line {first}); keep one");
        }
        let many = matches!(arg.get_action(), ArgAction::Append);
        let flag = matches!(arg.get_action(), ArgAction::SetTrue);
        let kind = if flag {
            "true or false"
        } else if numeric(arg) {
            "a number"
        } else {
            "a quoted string"
        };
        let wrong = |got: &str| -> anyhow::Error {
            let list = if many { ", or a list of them" } else { "" };
            anyhow::anyhow!("{at}: `{name}` must be {kind}{list}, not {got}")
        };
        let scalar = |v: &DeValue| -> Result<String> {
            match v {
                DeValue::String(s) if !flag && !numeric(arg) => Ok(s.to_string()),
                DeValue::Integer(i) if numeric(arg) && i.radix() == 10 => {
                    Ok(i.as_str().replace('_', ""))
                }
                DeValue::Float(f) if !flag && numeric(arg) => Ok(f.as_str().replace('_', "")),
                DeValue::Boolean(b) if flag => Ok(b.to_string()),
                DeValue::String(_) => Err(wrong("a string")),
                DeValue::Integer(_) => Err(wrong("a number")),
                DeValue::Float(_) => Err(wrong("a number")),
                DeValue::Boolean(_) => Err(wrong("true/false")),
                DeValue::Datetime(_) => Err(wrong("a date")),
                DeValue::Array(_) => Err(wrong("a list")),
                DeValue::Table(_) => Err(wrong("a table")),
            }
        };
        let values: Vec<String> = match value.get_ref() {
            DeValue::Array(items) if many => items
                .iter()
                .map(|v| scalar(v.get_ref()))
                .collect::<Result<_>>()?,
            v => vec![scalar(v)?],
        };
        let mut args = Vec::new();
        for v in &values {
            if flag {
                if v == "true" {
                    args.push(OsString::from(format!("--{name}")));
                }
            } else {
                args.push(OsString::from(format!("--{name}={v}")));
            }
        }
        // The flag's own parser judges the value, so the file accepts what
        // the flag accepts, and a mistake names its line.
        for a in &args {
            if let Err(e) = sub_cmd
                .clone()
                .try_get_matches_from([OsString::from("tessera"), a.clone()])
            {
                let msg = e.render().to_string();
                let first = msg.lines().next().unwrap_or_default();
                bail!("{at}: {}", first.trim_start_matches("error: "));
            }
        }
        out.push(Entry {
            id: arg.get_id().to_string(),
            line,
            args,
        });
    }
    Ok(out)
}

/// Hides a password in a URL (`postgres://user:PASSWORD@host`).
fn redact(value: &str) -> String {
    let Some(scheme) = value.find("://") else {
        return value.to_string();
    };
    let rest = &value[scheme + 3..];
    let Some(at) = rest.find('@') else {
        return value.to_string();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:<redacted>{}",
            &value[..scheme + 3],
            &rest[..colon],
            &rest[at..]
        ),
        None => value.to_string(),
    }
}

/// Quotes a value as TOML unless it is a number or a boolean.
fn toml_value(arg: &clap::Arg, raw: &str) -> String {
    let bare = matches!(arg.get_action(), ArgAction::SetTrue) || numeric(arg);
    if bare {
        raw.to_string()
    } else {
        format!("{raw:?}")
    }
}

/// `tessera config print ROLE [ARGS...]`: the merged options of a
/// coordinator or worker started with ARGS, each with its source, as a
/// config file; secrets redacted.
pub fn print(role: &str, args: &[OsString]) -> Result<String> {
    if !ROLES.contains(&role) {
        bail!("`tessera config print` takes coordinator or worker, not `{role}`; e.g. tessera config print worker --config /etc/tessera/worker.toml");
    }
    let mut argv = vec![OsString::from("tessera"), OsString::from(role)];
    argv.extend(args.iter().cloned());
    let (_, matches, from_file) = merge(argv)?;
    let (_, sub) = matches.subcommand().expect("a role");
    let mut cmd = Cli::command();
    cmd.build();
    let sub_cmd = cmd.find_subcommand(role).expect("a role");
    let mut out = format!("# tessera {role}: each option, and where its value came from\n");
    for (long, arg) in keys(sub_cmd) {
        let id = arg.get_id().as_str();
        let source = match from_file.get(id) {
            Some(s) => s.clone(),
            None => match sub.value_source(id) {
                Some(ValueSource::CommandLine) => Source::Flag,
                Some(ValueSource::EnvVariable) => Source::Env(
                    arg.get_env()
                        .map(|e| e.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                ),
                Some(ValueSource::DefaultValue) => Source::Default,
                _ => Source::Unset,
            },
        };
        let raw: Vec<String> = sub
            .get_raw(id)
            .map(|vs| vs.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let secret = long == "token";
        let shown: Vec<String> = raw
            .iter()
            .map(|v| {
                if secret {
                    "\"<redacted>\"".to_string()
                } else {
                    toml_value(arg, &redact(v))
                }
            })
            .collect();
        let line = match (&source, shown.as_slice()) {
            (Source::Unset, _) | (_, []) => format!("# {long} ="),
            (_, [one]) if !matches!(arg.get_action(), ArgAction::Append) => {
                format!("{long} = {one}")
            }
            (_, many) => format!("{long} = [{}]", many.join(", ")),
        };
        out.push_str(&format!("{line:<48} # {source}\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> clap::Command {
        let mut cmd = Cli::command();
        cmd.build();
        cmd.find_subcommand("worker").unwrap().clone()
    }

    fn check(text: &str) -> Result<Vec<Entry>> {
        read(text, Path::new("w.toml"), &worker())
    }

    #[test]
    fn keys_become_the_flags_arguments() {
        let e = check("slots = 4\ncache_max_gib = 2.5\ntag = [\"a\", \"b\"]\nuntrusted = true\nfresh-process = false\n").unwrap();
        let args: Vec<_> = e.iter().flat_map(|e| e.args.clone()).collect();
        let args: Vec<_> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert!(args.contains(&"--slots=4"), "{args:?}");
        assert!(args.contains(&"--cache-max-gib=2.5"), "{args:?}");
        assert!(args.contains(&"--tag=a") && args.contains(&"--tag=b"));
        assert!(args.contains(&"--untrusted"));
        assert!(!args.iter().any(|a| a.contains("fresh")));
    }

    #[test]
    fn mistakes_name_the_key_and_line() {
        let e = check("slots = 1\n\nslotz = 3\n").unwrap_err().to_string();
        assert!(e.starts_with("w.toml:3: unknown key `slotz`"), "{e}");
        assert!(e.contains("valid keys:") && e.contains("slots"), "{e}");
        let e = check("slots = \"four\"\n").unwrap_err().to_string();
        assert!(e.contains("w.toml:1: `slots` must be a number"), "{e}");
        let e = check("name = 3\n").unwrap_err().to_string();
        assert!(e.contains("`name` must be a quoted string"), "{e}");
        let e = check("device = \"tpu\"\n").unwrap_err().to_string();
        assert!(e.contains("w.toml:1:") && e.contains("tpu"), "{e}");
        let e = check("\ntoken = \"abc\"\n").unwrap_err().to_string();
        assert!(e.contains("w.toml:2:") && e.contains("token-file"), "{e}");
        let e = check("untrusted = 1\n").unwrap_err().to_string();
        assert!(e.contains("`untrusted` must be true or false"), "{e}");
    }

    #[test]
    fn passwords_in_urls_are_hidden() {
        assert_eq!(
            redact("postgres://tessera:hunter2@db:5432/t"),
            "postgres://tessera:<redacted>@db:5432/t"
        );
        assert_eq!(redact("postgres://tessera@db/t"), "postgres://tessera@db/t");
        assert_eq!(redact("s3://bucket/x"), "s3://bucket/x");
    }
}
