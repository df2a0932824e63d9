//! Who could fix a failed render: Blender's words turned into a scope the
//! coordinator acts on, and a reason that says what to do.
//!
//! [`classify`] is pure: it reads what kind of failure the worker saw (Blender
//! crashed, answered with an error, printed error lines, wrote a wrong frame)
//! and the lines Blender printed, and returns a [`Diagnosis`]. Specific
//! messages win over the kind: an out-of-memory message in the output of a
//! crashed Blender makes it this machine's problem, not a passing one.
//!
//! | Blender said | scope |
//! |---|---|
//! | built without OpenImageDenoise, or without another feature | everywhere |
//! | a Python error in a driver or script, a driver that needs Python | everywhere |
//! | the scene was saved by a newer Blender, has no camera | everywhere |
//! | an allocation refused under the worker's memory limit on Blender | everywhere |
//! | out of memory, no Cycles device, a missing or unwritable path | this machine |
//! | a GPU driver error, a crash, a kill, a wrong frame with no message | transient |

use std::fmt;

/// Who could render a task that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A passing fault: retry, here or elsewhere, in a fresh Blender.
    Transient,
    /// Only this machine has the problem: another worker may succeed.
    Machine,
    /// No worker can fix it: the job should fail now.
    Everywhere,
}

impl Scope {
    /// The protocol's value.
    pub fn to_proto(self) -> tessera_proto::FailureScope {
        match self {
            Self::Transient => tessera_proto::FailureScope::Transient,
            Self::Machine => tessera_proto::FailureScope::Machine,
            Self::Everywhere => tessera_proto::FailureScope::Everywhere,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Transient => "transient",
            Self::Machine => "this machine",
            Self::Everywhere => "everywhere",
        })
    }
}

/// What the worker saw go wrong, before Blender's words are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Blender exited, was killed or stopped answering.
    Crashed,
    /// Blender answered a render with an error, or printed error lines.
    BlenderError,
    /// Blender finished, but the frame is not one it really rendered.
    BadFrame,
    /// The scene reads files that are not part of the job.
    OutsideFiles,
    /// The scene was saved by a newer Blender than this worker's.
    NewerBlender,
    /// The worker itself could not do its part (disk, cache).
    WorkerDisk,
    /// Moving the scene or the frames to or from the coordinator failed.
    Transfer,
    /// The coordinator refused the result for good.
    Refused,
    /// The task asks for something this worker's admin does not allow
    /// (the scene's stored Python).
    NotAllowed,
}

/// A failure's scope and the reason to report, with the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// Who could fix it.
    pub scope: Scope,
    /// What happened, in Blender's words, then what to do.
    pub reason: String,
}

/// Messages Blender prints that decide the scope whatever the kind, with the
/// fix to report. Matched lowercase, first match wins.
const RULES: &[(&[&str], Scope, &str)] = &[
    (
        &[
            "build without openimagedenoiser",
            "openimagedenoiser is not supported",
            "no device available to denoise on",
        ],
        Scope::Everywhere,
        "this worker's Blender was built without OpenImageDenoise: turn off denoising \
         (Render Properties > Sampling > Denoise, and the view layer's Denoising Data), \
         or add workers whose Blender has it",
    ),
    (
        &["build without"],
        Scope::Everywhere,
        "this worker's Blender lacks a feature the scene uses: turn it off in the scene, \
         or add workers whose Blender has it",
    ),
    (
        &["restricted access disallows name"],
        Scope::Everywhere,
        "a driver needs Python, which workers do not run (auto-execution is off): use a \
         simple expression, or bake the animation (Object > Animation > Bake Action)",
    ),
    (
        &[
            "error in pydriver",
            "error in driver",
            "in driver:",
            "traceback (most recent call last)",
        ],
        Scope::Everywhere,
        "the scene's Python (a driver or script) fails: fix it in Blender, check that \
         `blender -b scene.blend -f 1` renders, and submit again",
    ),
    (
        &["no camera"],
        Scope::Everywhere,
        "the scene has no active camera: add one (or set Scene > Camera) and submit again",
    ),
    (
        // Blender's allocator under the worker's limit on its memory.
        &[
            "malloc returns null",
            "calloc returns null",
            "mallocn returns null",
        ],
        Scope::Everywhere,
        "Blender hit the memory limit workers set on it (--blender-max-memory-gib) reading \
         or rendering this file: the .blend may be a compression bomb (a small file that \
         expands past any memory) or need more memory than workers allow; open it in \
         Blender to check, and submit it again saved without compression",
    ),
    (
        &[
            "out of memory",
            "out of gpu memory",
            "bad_alloc",
            "cannot allocate memory",
            "failed to allocate",
        ],
        Scope::Machine,
        "this worker ran out of memory: a worker with more memory may render it; otherwise \
         lower the scene's memory use (Simplify, smaller textures, less subdivision)",
    ),
    (
        &["found no cycles device"],
        Scope::Machine,
        "Blender on this worker cannot use its GPU: the slot takes CPU work only from now \
         on; check the GPU driver",
    ),
    (
        &[
            "no such file or directory",
            "permission denied",
            "read-only file system",
            "no space left on device",
            "cannot read file",
            "cannot save",
            "cannot create output_dir",
            "cannot open file for writing",
        ],
        Scope::Machine,
        "a path on this worker is missing or unwritable (a mount, the cache disk): another \
         worker may render it; check this worker's disks and mounts",
    ),
    (
        &[
            "cuda error",
            "optix error",
            "hip error",
            "metal error",
            "oneapi error",
            "illegal address",
            "launch failed",
        ],
        Scope::Transient,
        "the GPU driver failed during the render: it is retried in a fresh Blender",
    ),
];

/// The scope of a failure of `kind`, given `words` (the reason and the error
/// lines Blender printed), and the reason to report: `what` plus the fix.
pub fn classify(kind: Kind, what: &str, words: &str) -> Diagnosis {
    let text = format!("{what}\n{words}").to_lowercase();
    let fixed = |scope: Scope, fix: &str| Diagnosis {
        scope,
        reason: format!("{what}; {fix}"),
    };
    // The kinds the worker established itself are not second-guessed by text.
    match kind {
        Kind::OutsideFiles => {
            return fixed(
                Scope::Everywhere,
                "put them where the scene expects them and submit again with `tessera submit`, \
                 which sends every file the scene uses with the job (or pack them: File > \
                 External Data > Pack Resources)",
            )
        }
        Kind::NewerBlender => {
            return fixed(
                Scope::Everywhere,
                "save it with this worker's Blender version, or add workers with a Blender \
                 at least as new",
            )
        }
        Kind::Refused => {
            return fixed(
                Scope::Everywhere,
                "the coordinator will not accept this result from any worker; check the \
                 scene's output settings",
            )
        }
        Kind::NotAllowed => {
            return fixed(
                Scope::Machine,
                "a worker started with --allow-scene-python may render it",
            )
        }
        _ => {}
    }
    if let Some((_, scope, fix)) = RULES
        .iter()
        .find(|(needles, _, _)| needles.iter().any(|n| text.contains(n)))
    {
        return fixed(*scope, fix);
    }
    if has_python_exception(what) || has_python_exception(words) {
        return fixed(Scope::Everywhere, RULES[3].2);
    }
    match kind {
        Kind::Crashed => fixed(
            Scope::Transient,
            "it is retried in a fresh Blender; if it keeps crashing, render one frame with \
             `blender -b scene.blend -f N` to see why",
        ),
        Kind::BadFrame => fixed(
            Scope::Transient,
            "the frame is not trusted and is rendered again in a fresh Blender",
        ),
        Kind::WorkerDisk => fixed(
            Scope::Machine,
            "another worker may render it; check this worker's cache disk",
        ),
        Kind::Transfer => fixed(Scope::Transient, "it is retried"),
        Kind::BlenderError => Diagnosis {
            scope: Scope::Transient,
            reason: what.to_string(),
        },
        Kind::OutsideFiles | Kind::NewerBlender | Kind::Refused | Kind::NotAllowed => {
            unreachable!("handled above")
        }
    }
}

/// Whether some line is the last line of a Python traceback (`ValueError: ...`).
fn has_python_exception(text: &str) -> bool {
    text.lines().any(is_python_exception)
}

/// Whether a line is the last line of a Python traceback (`ValueError: ...`).
pub fn is_python_exception(line: &str) -> bool {
    let Some((name, _)) = line.split_once(": ") else {
        return false;
    };
    !name.is_empty()
        && !line.starts_with(' ')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && (name.ends_with("Error") || name.ends_with("Exception"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_exceptions() {
        assert!(is_python_exception(
            "ValueError: invalid literal for int() with base 10: 'tessera'"
        ));
        assert!(is_python_exception(
            "RuntimeError: tessera: the scene renders 10x10"
        ));
        assert!(!is_python_exception(
            "  File \"<bpy driver>\", line 1, in <module>"
        ));
        assert!(!is_python_exception("Fra:1 Mem:1M | Error: x"));
    }

    #[test]
    fn a_missing_denoiser_fails_everywhere_with_the_fix() {
        let d = classify(
            Kind::BlenderError,
            "Blender could not render frame 1: render failed: Error: Build without OpenImageDenoiser",
            "Build without OpenImageDenoiser\nNo device available to denoise on",
        );
        assert_eq!(d.scope, Scope::Everywhere);
        assert!(
            d.reason.contains("Build without OpenImageDenoiser")
                && d.reason.contains("turn off denoising"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn python_errors_in_the_scene_fail_everywhere() {
        for words in [
            "Error in PyDriver: expression failed: int('tessera') + frame",
            "BPY_driver_exec: restricted access disallows name 'context', enable auto-execution to support",
            "Traceback (most recent call last):\nValueError: invalid literal",
            "ERROR (bke.fcurve): fcurve_driver.c:1007 driver_evaluate_simple_expr: Division by Zero in Driver: '1/0 + frame'",
            "ValueError: invalid literal for int() with base 10: 'tessera'",
        ] {
            let d = classify(Kind::BlenderError, "Blender reported an error", words);
            assert_eq!(d.scope, Scope::Everywhere, "{words}");
        }
        let d = classify(
            Kind::BlenderError,
            "x",
            "restricted access disallows name 'context'",
        );
        assert!(d.reason.contains("simple expression"), "{}", d.reason);
    }

    #[test]
    fn a_scene_past_the_memory_limit_fails_everywhere_naming_the_file() {
        // What Blender 3.4 prints for a gzip bomb under RLIMIT_DATA.
        let words = "Malloc returns null: len=1500000056 in new_bhead, total 10115412\n\
                     Error: Failed to read blend file '/cache/scenes/ab.blend': Missing DNA block";
        let d = classify(
            Kind::Crashed,
            "Blender exited (exit status: 1): Error: Failed to read blend file '/cache/scenes/ab.blend': Missing DNA block",
            words,
        );
        assert_eq!(d.scope, Scope::Everywhere);
        assert!(
            d.reason.contains("'/cache/scenes/ab.blend'")
                && d.reason.contains("--blender-max-memory-gib")
                && !d.reason.contains("Python"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn machine_problems_stay_with_the_machine() {
        for words in [
            "Error: System is out of GPU memory",
            "CUDA error: Out of memory in cuMemAlloc_v2",
            "terminate called after throwing an instance of 'std::bad_alloc'",
            "Error: Found no Cycles device of the specified type",
            "Error: Cannot read file '/mnt/assets/x.blend': No such file or directory",
            "Render error (Read-only file system) cannot save: '/out/frame_0001.png'",
        ] {
            let d = classify(Kind::BlenderError, "Blender failed", words);
            assert_eq!(d.scope, Scope::Machine, "{words}");
        }
        // Memory wins over the crash that followed it.
        let d = classify(
            Kind::Crashed,
            "Blender exited (signal: 6)",
            "std::bad_alloc",
        );
        assert_eq!(d.scope, Scope::Machine);
    }

    #[test]
    fn crashes_and_driver_hiccups_are_transient() {
        let d = classify(
            Kind::Crashed,
            "Blender exited (signal: 9 (SIGKILL)) while rendering frame 3",
            "Fra:3 Mem:12M | Sample 4/64",
        );
        assert_eq!(d.scope, Scope::Transient);
        assert!(d.reason.contains("fresh Blender"), "{}", d.reason);
        let d = classify(
            Kind::BlenderError,
            "render failed",
            "Error: CUDA error: Launch failed in cuCtxSynchronize()",
        );
        assert_eq!(d.scope, Scope::Transient);
    }

    #[test]
    fn a_wrong_frame_without_words_is_retried() {
        let d = classify(
            Kind::BadFrame,
            "Blender finished frame 1 without rendering a single sample",
            "",
        );
        assert_eq!(d.scope, Scope::Transient);
        // ...but not when Blender said why.
        let d = classify(
            Kind::BadFrame,
            "Blender finished frame 1 without rendering a single sample",
            "Build without OpenImageDenoiser",
        );
        assert_eq!(d.scope, Scope::Everywhere);
    }

    #[test]
    fn what_the_worker_established_is_not_second_guessed() {
        let d = classify(
            Kind::OutsideFiles,
            "the scene reads /mnt/tex.png",
            "No such file or directory",
        );
        assert_eq!(d.scope, Scope::Everywhere);
        assert!(d.reason.contains("submit again"), "{}", d.reason);
        let d = classify(Kind::Refused, "the coordinator refused: bad", "");
        assert_eq!(d.scope, Scope::Everywhere);
        let d = classify(Kind::NewerBlender, "saved by Blender 4.2", "");
        assert_eq!(d.scope, Scope::Everywhere);
        let d = classify(Kind::NotAllowed, "the job runs stored Python", "Traceback");
        assert_eq!(d.scope, Scope::Machine);
        assert!(d.reason.contains("--allow-scene-python"), "{}", d.reason);
    }

    #[test]
    fn unknown_errors_are_retried_with_blenders_words() {
        let d = classify(
            Kind::BlenderError,
            "Blender reported an error: Error: something new",
            "",
        );
        assert_eq!(d.scope, Scope::Transient);
        assert_eq!(d.reason, "Blender reported an error: Error: something new");
        assert_eq!(Scope::Everywhere.to_proto() as i32, 3);
    }
}
