//! What a user's scene can reach: Blender's command line and environment,
//! and the worker's own memory.
//!
//! - Blender starts with `--factory-startup` (no preferences or startup file
//!   of the worker's account) and `--disable-autoexec` (no Python stored in
//!   the scene runs: no registered text blocks, no drivers beyond Blender's
//!   restricted expressions), whatever the account's preferences say. Only a
//!   job that asks for stored Python (`submit --scene-python`), on a worker
//!   whose admin allows it (`worker --allow-scene-python`), gets
//!   `--enable-autoexec` instead ([`blender_flags`]).
//! - Its environment is rebuilt from a short allow-list ([`blender_env`]):
//!   nothing named `TESSERA_*`, no token, no coordinator address, no cloud
//!   credentials; `TMPDIR` points into the worker's cache, and Blender's user
//!   folders (`BLENDER_USER_*`: preferences, scripts, extensions) point to
//!   empty folders there, so neither kind of runtime loads the account's
//!   add-ons or startup scripts.
//! - The `bpy` module runs the same way ([`crate::runtime`]): Python with
//!   `-I`, factory settings, the scene opened without its Python.
//! - The worker makes itself non-dumpable ([`hide_worker_memory`]), so a
//!   process of the same user (Blender) cannot read `/proc/<worker>/environ`
//!   or `/proc/<worker>/mem`, where the token lives. `/proc/<worker>/cmdline`
//!   stays readable to everyone: pass the token with `--token-file`, never
//!   `--token`, on shared machines.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// Variables passed to Blender unchanged.
const KEEP: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "LD_LIBRARY_PATH",
    "OCIO",
];

/// Prefixes of variables passed to Blender unchanged: locale, Blender's own
/// paths, colour management and GPU runtimes.
const KEEP_PREFIXES: &[&str] = &[
    "LC_", "BLENDER_", "OCIO_", "CUDA_", "NVIDIA_", "OPTIX_", "HIP_", "ROCR_", "HSA_", "VK_",
    "MESA_",
];

/// Words that keep a variable out even when its prefix is allowed.
const SECRET_WORDS: &[&str] = &["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY"];

/// Whether variable `name` may reach Blender.
pub fn passes_to_blender(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("TESSERA") || SECRET_WORDS.iter().any(|w| upper.contains(w)) {
        return false;
    }
    KEEP.contains(&name) || KEEP_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Blender's environment: the allowed part of `vars`, with its temporary
/// directory set to `tmp`.
pub fn blender_env(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    tmp: &Path,
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = vars
        .into_iter()
        .filter(|(k, _)| {
            passes_to_blender(k) && !k.to_str().is_some_and(|k| k.starts_with("BLENDER_USER_"))
        })
        .collect();
    for k in ["TMPDIR", "TEMP", "TMP"] {
        env.push((k.into(), tmp.as_os_str().to_owned()));
    }
    let user = tmp.join("blender-user");
    for (k, sub) in USER_DIRS {
        env.push((k.into(), user.join(sub).into_os_string()));
    }
    env
}

/// Blender's user folders, each pointed at an empty folder of the worker's.
const USER_DIRS: [(&str, &str); 5] = [
    ("BLENDER_USER_RESOURCES", "resources"),
    ("BLENDER_USER_CONFIG", "config"),
    ("BLENDER_USER_SCRIPTS", "scripts"),
    ("BLENDER_USER_DATAFILES", "datafiles"),
    ("BLENDER_USER_EXTENSIONS", "extensions"),
];

/// Blender's arguments before the scene's own: background mode, no
/// preferences, and no stored Python unless `scene_python` (a pool whose
/// admin allowed it, for a job that asked).
pub const fn blender_flags(scene_python: bool) -> [&'static str; 3] {
    [
        "-b",
        "--factory-startup",
        if scene_python {
            "--enable-autoexec"
        } else {
            "--disable-autoexec"
        },
    ]
}

/// Makes this process non-dumpable: processes of the same user can no longer
/// read its memory or environment through `/proc` or ptrace. Core dumps of
/// the worker are off from then on.
#[allow(unsafe_code)]
pub fn hide_worker_memory() -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers and touches no memory.
    let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(names: &[&str]) -> Vec<(OsString, OsString)> {
        names
            .iter()
            .map(|n| (OsString::from(n), OsString::from("v")))
            .collect()
    }

    #[test]
    fn secrets_and_the_farm_address_stay_out() {
        let env = blender_env(
            vars(&[
                "PATH",
                "HOME",
                "LC_ALL",
                "TESSERA_TOKEN",
                "TESSERA_COORDINATOR",
                "TESSERA_CA",
                "tessera_token",
                "AWS_SECRET_ACCESS_KEY",
                "GITHUB_TOKEN",
                "CUDA_VISIBLE_DEVICES",
                "BLENDER_USER_SCRIPTS",
                "BLENDER_API_KEY",
                "OCIO",
                "SSH_AUTH_SOCK",
                "PYTHONPATH",
                "TMPDIR",
            ]),
            Path::new("/cache/tmp/blender/0"),
        );
        let names: Vec<&str> = env.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "PATH",
                "HOME",
                "LC_ALL",
                "CUDA_VISIBLE_DEVICES",
                "OCIO",
                "TMPDIR",
                "TEMP",
                "TMP",
                "BLENDER_USER_RESOURCES",
                "BLENDER_USER_CONFIG",
                "BLENDER_USER_SCRIPTS",
                "BLENDER_USER_DATAFILES",
                "BLENDER_USER_EXTENSIONS"
            ]
        );
        let scripts = env
            .iter()
            .find(|(k, _)| k == "BLENDER_USER_SCRIPTS")
            .unwrap();
        assert!(Path::new(&scripts.1).starts_with("/cache/tmp/blender/0"));
        assert!(env
            .iter()
            .filter(|(k, _)| k == "TMPDIR")
            .all(|(_, v)| v == "/cache/tmp/blender/0"));
    }

    #[test]
    fn blender_runs_stored_python_only_when_asked() {
        assert_eq!(
            blender_flags(false),
            ["-b", "--factory-startup", "--disable-autoexec"]
        );
        assert_eq!(
            blender_flags(true),
            ["-b", "--factory-startup", "--enable-autoexec"]
        );
    }

    #[test]
    fn the_worker_can_hide_its_memory() {
        hide_worker_memory().unwrap();
        #[allow(unsafe_code)]
        // SAFETY: PR_GET_DUMPABLE reads a flag of this process.
        let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
        assert_eq!(dumpable, 0);
    }
}
