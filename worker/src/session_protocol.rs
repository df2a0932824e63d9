//! The messages between the worker and `blender/session.py`: one JSON object
//! a line, commands on Blender's stdin and replies on the reply pipe (see
//! `blender/README.md`). Both sides are shipped together (the script is
//! compiled into the worker), so the shapes here are the protocol; the script
//! checks each command against them and answers an `error` for one it cannot
//! read.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The line the session writes on stdout and on stderr after everything it
/// printed while loading, right before its `ready` reply
/// (`OUTPUT_MARK` in `blender/session.py`): the worker reads both streams
/// up to it before it looks at the load's warnings. Not Blender's output:
/// never kept in a log.
pub const OUTPUT_MARK: &str = "\u{1b}tessera-loaded";

/// A command to the session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Command {
    /// Render one frame (or one tile of it).
    Render(Render),
    /// End the session (EOF on stdin does the same).
    Quit,
    /// A spare session's first line: load this scene (see [`Open`]).
    Open(Open),
}

/// Loads `scene` in a session started with `--spare` (before its task was
/// known), as the command line would have loaded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Open {
    /// Absolute: the scene file.
    pub scene: PathBuf,
    /// The job's root, for a scene with a file set (`--job-root`).
    pub job_root: Option<PathBuf>,
    /// The mappings file, for a scene with a file set (`--mappings`).
    pub mappings: Option<PathBuf>,
    /// Run the scene's stored Python: the same as the spare was started
    /// with (`--enable-autoexec`).
    pub scene_python: bool,
}

/// Renders `frame` into `output_dir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Render {
    /// Names the replies that belong to this command.
    pub id: u64,
    /// The scene frame.
    pub frame: u32,
    /// Absolute: the task's folder, created when missing.
    pub output_dir: PathBuf,
    /// Render threads; `None` keeps the scene's own setting.
    pub threads: Option<u32>,
    /// One tile of the frame; `None` renders it whole.
    pub tile: Option<Tile>,
}

/// One tile of a frame, as Blender's render border.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tile {
    /// `[min_x, max_x, min_y, max_y]`: pixel-centre fractions, y from the bottom.
    pub border: [f64; 4],
    /// The tile's size in pixels: the image Blender must write.
    pub size: [u32; 2],
    /// The whole frame's size, which the scene must render.
    pub frame: [u32; 2],
}

/// A reply from the session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Reply {
    /// The scene is loaded; sent once, before the first command is read.
    Ready(Ready),
    /// Samples done so far by the render of command `id`.
    Progress(Progress),
    /// Command `id` rendered its frame.
    Done(Done),
    /// Command `id` failed (`None` for a line that had no readable id); the
    /// session keeps serving.
    Error(Failed),
}

impl Reply {
    /// The command this reply answers (none for `ready`).
    pub fn id(&self) -> Option<u64> {
        match self {
            Reply::Ready(_) => None,
            Reply::Progress(p) => Some(p.id),
            Reply::Done(d) => Some(d.id),
            Reply::Error(e) => e.id,
        }
    }
}

/// The loaded scene, as the session found it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ready {
    /// Blender's process id.
    pub pid: u32,
    /// Blender's version (`3.4.1`).
    pub blender: String,
    /// The render engine (`CYCLES`).
    pub engine: String,
    /// Files the scene refers to outside the job.
    pub outside: Vec<Outside>,
    /// The version that saved the scene, when newer than this Blender.
    pub newer: Option<String>,
    /// Why the scene's stored Python did not run (auto-run is off).
    pub scripts_skipped: Option<String>,
    /// The text blocks registered to run on load (when they did not run).
    pub scripts: Vec<String>,
    /// The output size the scene renders (resolution × percentage).
    pub width: u64,
    /// See `width`.
    pub height: u64,
}

/// A file the scene refers to outside the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outside {
    /// Its absolute path.
    pub path: String,
    /// Whether it is missing on this machine too.
    pub missing: bool,
}

/// Progress of a render.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The render command.
    pub id: u64,
    /// Samples done (over all of Cycles' tiles).
    pub samples_done: u64,
    /// Samples in all.
    pub samples_total: u64,
}

/// A frame rendered and saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    /// The render command.
    pub id: u64,
    /// The image file.
    pub path: PathBuf,
    /// Its width, read from the file.
    pub width: u32,
    /// Its height, read from the file.
    pub height: u32,
    /// What the scene renders, or the tile's size.
    pub expected: [u32; 2],
    /// The render engine.
    pub engine: String,
    /// Most samples Cycles said it finished; `None` when it said nothing.
    pub samples_done: Option<u32>,
    /// Samples it was asked for; `None` when it said nothing.
    pub samples_total: Option<u32>,
    /// Whether the session counted samples at all (not with `--no-progress`).
    pub counted: bool,
    /// Files the scene's File Output nodes wrote during this render.
    pub passes: Vec<Pass>,
    /// Frame change, render and save, seconds.
    pub seconds: f64,
}

/// A file a File Output node wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pass {
    /// Relative to the passes folder (`File Output/Image0005.png`).
    pub name: String,
    /// The file.
    pub path: PathBuf,
}

/// Why a command failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failed {
    /// The command, when its line had a readable id.
    pub id: Option<u64>,
    /// One line.
    pub error: String,
}

/// The line that sends `cmd` (with its newline).
pub fn line(cmd: &Command) -> String {
    let mut line = serde_json::to_string(cmd).expect("a command serializes");
    line.push('\n');
    line
}

/// Reads one reply line.
pub fn read(line: &str) -> Result<Reply, serde_json::Error> {
    serde_json::from_str(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn as_json(cmd: &Command) -> Value {
        serde_json::from_str(&line(cmd)).unwrap()
    }

    #[test]
    fn a_render_command_is_the_line_session_py_reads() {
        let whole = Command::Render(Render {
            id: 7,
            frame: 5,
            output_dir: "/abs/dir".into(),
            threads: Some(1),
            tile: None,
        });
        assert!(line(&whole).ends_with('\n') && !line(&whole).trim_end().contains('\n'));
        assert_eq!(
            as_json(&whole),
            json!({"cmd": "render", "id": 7, "frame": 5, "output_dir": "/abs/dir", "threads": 1, "tile": null})
        );
        let tile = Command::Render(Render {
            id: 8,
            frame: 1,
            output_dir: "/t".into(),
            threads: None,
            tile: Some(Tile {
                border: [0.0, 0.5, 0.25, 1.0],
                size: [32, 36],
                frame: [64, 48],
            }),
        });
        assert_eq!(
            as_json(&tile),
            json!({"cmd": "render", "id": 8, "frame": 1, "output_dir": "/t", "threads": null,
                   "tile": {"border": [0.0, 0.5, 0.25, 1.0], "size": [32, 36], "frame": [64, 48]}})
        );
        assert_eq!(as_json(&Command::Quit), json!({"cmd": "quit"}));
        let open = Command::Open(Open {
            scene: "/c/scene.blend".into(),
            job_root: Some("/c/root".into()),
            mappings: None,
            scene_python: false,
        });
        assert_eq!(
            as_json(&open),
            json!({"cmd": "open", "scene": "/c/scene.blend", "job_root": "/c/root",
                   "mappings": null, "scene_python": false})
        );
        // And back: what the worker writes is what the protocol reads.
        for cmd in [whole, tile, Command::Quit, open] {
            assert_eq!(serde_json::from_str::<Command>(&line(&cmd)).unwrap(), cmd);
        }
    }

    #[test]
    fn commands_with_unknown_names_or_fields_do_not_read() {
        for bad in [
            r#"{"cmd": "paint", "id": 1}"#,
            r#"{"cmd": "render", "id": 1, "frame": 1, "output_dir": "/o", "threads": null, "tile": null, "colour": 1}"#,
            r#"{"cmd": "render", "id": 1, "output_dir": "/o", "threads": null, "tile": null}"#,
            r#"{"cmd": "render", "id": 1, "frame": "one", "output_dir": "/o", "threads": null, "tile": null}"#,
            r#"{"id": 1}"#,
        ] {
            assert!(serde_json::from_str::<Command>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_reply_of_the_readme_reads() {
        let ready = read(
            r#"{"event":"ready","pid":1234,"blender":"3.4.1","engine":"CYCLES","outside":[{"path":"/abs/tex.png","missing":true}],"newer":null,"scripts_skipped":null,"scripts":[],"width":64,"height":48}"#,
        )
        .unwrap();
        let Reply::Ready(r) = &ready else {
            panic!("{ready:?}")
        };
        assert_eq!(
            (r.pid, r.blender.as_str(), r.width, r.height),
            (1234, "3.4.1", 64, 48)
        );
        assert_eq!(
            r.outside,
            [Outside {
                path: "/abs/tex.png".into(),
                missing: true
            }]
        );
        assert_eq!(
            (r.newer.as_deref(), r.scripts_skipped.as_deref()),
            (None, None)
        );
        assert_eq!(ready.id(), None);

        let progress =
            read(r#"{"event":"progress","id":7,"samples_done":12,"samples_total":64}"#).unwrap();
        assert_eq!(
            progress,
            Reply::Progress(Progress {
                id: 7,
                samples_done: 12,
                samples_total: 64
            })
        );

        let done = read(
            r#"{"event":"done","id":7,"path":"/abs/dir/frame_0005.png","width":64,"height":48,"expected":[64,48],"engine":"CYCLES","samples_done":64,"samples_total":64,"counted":true,"passes":[{"name":"File Output/Image0005.png","path":"/abs/dir/passes/File Output/Image0005.png"}],"seconds":0.31}"#,
        )
        .unwrap();
        let Reply::Done(d) = &done else {
            panic!("{done:?}")
        };
        assert_eq!(d.path, PathBuf::from("/abs/dir/frame_0005.png"));
        assert_eq!((d.width, d.height, d.expected), (64, 48, [64, 48]));
        assert_eq!((d.samples_done, d.counted), (Some(64), true));
        assert_eq!(d.passes[0].name, "File Output/Image0005.png");
        assert_eq!(done.id(), Some(7));
        let uncounted = read(
            r#"{"event":"done","id":8,"path":"/p.png","width":1,"height":1,"expected":[1,1],"engine":"CYCLES","samples_done":null,"samples_total":null,"counted":false,"passes":[],"seconds":0.1}"#,
        )
        .unwrap();
        assert!(matches!(
            uncounted,
            Reply::Done(Done {
                samples_done: None,
                ..
            })
        ));

        let error = read(r#"{"event":"error","id":7,"error":"render failed: no camera"}"#).unwrap();
        assert_eq!(error.id(), Some(7));
        let unreadable = read(r#"{"event":"error","id":null,"error":"bad JSON command"}"#).unwrap();
        assert_eq!(
            unreadable,
            Reply::Error(Failed {
                id: None,
                error: "bad JSON command".into()
            })
        );
        // A round trip keeps every reply.
        for reply in [ready, progress, done, error] {
            let text = serde_json::to_string(&reply).unwrap();
            assert_eq!(read(&text).unwrap(), reply);
        }
    }

    #[test]
    fn replies_the_protocol_does_not_have_do_not_read() {
        for bad in [
            r#"{"event":"finished","id":7}"#,
            r#"{"event":"done","id":7}"#,
            r#"{"id":7,"error":"x"}"#,
            "not json",
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }
}
