//! Frames to an H.264 MP4 with ffmpeg.
//!
//! Each frame is read from the blob store, decoded, tone-mapped to 8-bit
//! sRGB when it holds linear light (OpenEXR; see [`crate::imaging::frame_image`]),
//! padded to even dimensions (see [`pad_even`]) and written as a numbered
//! PNG into a temporary folder; ffmpeg then reads that sequence at the
//! job's frame rate and writes `yuv420p` H.264 with its index at the front
//! (`-movflags +faststart`), so a browser starts playing before the whole
//! file arrived. ffmpeg runs as a process (Debian's `ffmpeg`), under a time
//! limit; only one frame is held in memory at a time.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::blobs::BlobStore;
use crate::imaging::frame_image;
use crate::imaging::limits::PixelLimit;
use crate::model::task::FrameOutput;

/// How the coordinator runs ffmpeg.
#[derive(Debug, Clone)]
pub struct Ffmpeg {
    /// The executable: a path, or a name looked up on `PATH`.
    pub program: PathBuf,
    /// The longest one preview may take, frames and ffmpeg together.
    pub timeout: Duration,
}

impl Default for Ffmpeg {
    fn default() -> Self {
        Self {
            program: PathBuf::from("ffmpeg"),
            timeout: Duration::from_secs(600),
        }
    }
}

/// An encoded preview.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The MP4 file.
    pub bytes: Vec<u8>,
    /// Frames in it.
    pub frames: u32,
    /// Its width (even).
    pub width: u32,
    /// Its height (even).
    pub height: u32,
}

/// Why a preview could not be made. Every message names the cause and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// ffmpeg could not be started: not installed, or not at the given path.
    #[error("ffmpeg could not be started as `{program}` ({source}); install it on the coordinator's machine (Debian/Ubuntu: apt-get install ffmpeg) or start the coordinator with --ffmpeg /path/to/ffmpeg")]
    NoFfmpeg {
        /// What was run.
        program: String,
        /// Why it did not start.
        source: std::io::Error,
    },
    /// ffmpeg ran and failed.
    #[error("ffmpeg failed ({status}): {log}; check that `{program}` is a working ffmpeg with libx264 (Debian's ffmpeg package has it)")]
    FfmpegFailed {
        /// What was run.
        program: String,
        /// Its exit status.
        status: String,
        /// The end of what it printed.
        log: String,
    },
    /// Making the preview took longer than the limit.
    #[error("making the preview took longer than {secs} s and was stopped; start the coordinator with a larger --preview-timeout, or make previews of fewer frames")]
    TimedOut {
        /// The limit.
        secs: u64,
    },
    /// The job has no frames to show.
    #[error("the job has no rendered frames to make a preview of")]
    NoFrames,
    /// A frame could not be read or decoded.
    #[error("frame {frame} cannot go into the preview: {message}")]
    Frame {
        /// The frame number.
        frame: u32,
        /// What went wrong.
        message: String,
    },
    /// The frames are not all the same size.
    #[error("frame {frame} is {got_w}x{got_h} but frame {first} is {w}x{h}; a video needs frames of one size")]
    MixedSizes {
        /// The odd frame.
        frame: u32,
        /// Its size.
        got_w: u32,
        /// Its height.
        got_h: u32,
        /// The first frame.
        first: u32,
        /// The first frame's size.
        w: u32,
        /// Its height.
        h: u32,
    },
    /// The coordinator's scratch space failed.
    #[error("{context}: {source}; free space on the coordinator's --data volume")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl PreviewError {
    /// The message for job `job`'s status: where the coordinator's set-up
    /// is at fault (ffmpeg, its time limit, its disk), how to try again
    /// once it is fixed.
    pub fn for_job(&self, job: u64) -> String {
        match self {
            Self::NoFfmpeg { .. }
            | Self::FfmpegFailed { .. }
            | Self::TimedOut { .. }
            | Self::Io { .. } => format!("{self}, then `tessera preview {job}`"),
            Self::NoFrames | Self::Frame { .. } | Self::MixedSizes { .. } => self.to_string(),
        }
    }
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PreviewError {
    let context = context.into();
    move |source| PreviewError::Io { context, source }
}

/// Pads 8-bit RGB `rgb` (`w` x `h`) to even dimensions, as `yuv420p`
/// needs: its colour is stored once per 2x2 block, so H.264 in that format
/// takes only even widths and heights. An odd width gains one column and an
/// odd height one row, copies of the last column and row, so the video is
/// at most one pixel wider and taller than the frames. Returns the new size.
pub fn pad_even(rgb: &mut Vec<u8>, w: u32, h: u32) -> (u32, u32) {
    let (nw, nh) = (w + w % 2, h + h % 2);
    if (nw, nh) == (w, h) || w == 0 || h == 0 {
        return (w, h);
    }
    let (w, h, nw) = (w as usize, h as usize, nw as usize);
    let mut out = Vec::with_capacity(nw * nh as usize * 3);
    for y in 0..h {
        let row = &rgb[y * w * 3..(y + 1) * w * 3];
        out.extend_from_slice(row);
        if nw > w {
            out.extend_from_slice(&row[(w - 1) * 3..]);
        }
    }
    if nh as usize > h {
        let last = out[(h - 1) * nw * 3..].to_vec();
        out.extend_from_slice(&last);
    }
    *rgb = out;
    (nw as u32, nh)
}

/// The ffmpeg arguments that turn the numbered PNGs in `dir` into `out`.
pub fn ffmpeg_args(dir: &Path, fps: f64, out: &Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "-hide_banner",
        "-loglevel",
        "error",
        "-nostdin",
        "-y",
        "-framerate",
        &format!("{fps}"),
        "-start_number",
        "1",
        "-i",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(dir.join("%06d.png").into());
    for a in [
        "-c:v",
        "libx264",
        "-preset",
        "veryfast",
        "-crf",
        "20",
        "-pix_fmt",
        "yuv420p",
        "-movflags",
        "+faststart",
    ] {
        args.push(a.into());
    }
    args.push(out.into());
    args
}

/// Makes an MP4 of `frames` (read from `blobs`, in the order given) at
/// `fps`, working in a temporary folder under `scratch`.
pub fn encode(
    frames: &[FrameOutput],
    blobs: &dyn BlobStore,
    fps: f64,
    ffmpeg: &Ffmpeg,
    limit: PixelLimit,
    scratch: &Path,
) -> Result<Encoded, PreviewError> {
    let started = Instant::now();
    let deadline = started + ffmpeg.timeout;
    let Some(first) = frames.first() else {
        return Err(PreviewError::NoFrames);
    };
    // Say at once when there is no ffmpeg, before decoding any frame.
    run(
        ffmpeg,
        &["-hide_banner".into(), "-version".into()],
        None,
        deadline,
    )?;
    std::fs::create_dir_all(scratch).map_err(io(format!("cannot create {}", scratch.display())))?;
    let dir = tempfile::Builder::new()
        .prefix("preview-")
        .tempdir_in(scratch)
        .map_err(io(format!("cannot make a folder in {}", scratch.display())))?;
    let mut size = None;
    for (i, f) in frames.iter().enumerate() {
        if Instant::now() > deadline {
            return Err(PreviewError::TimedOut {
                secs: ffmpeg.timeout.as_secs(),
            });
        }
        let bad = |message: String| PreviewError::Frame {
            frame: f.frame,
            message,
        };
        let bytes = blobs.read(&f.digest).map_err(|e| bad(e.to_string()))?;
        let image = frame_image::decode(&bytes, &f.ext, limit).map_err(|e| bad(e.to_string()))?;
        drop(bytes);
        let (w, h) = (image.width, image.height);
        match size {
            None => size = Some((w, h)),
            Some((fw, fh)) if (fw, fh) != (w, h) => {
                return Err(PreviewError::MixedSizes {
                    frame: f.frame,
                    got_w: w,
                    got_h: h,
                    first: first.frame,
                    w: fw,
                    h: fh,
                })
            }
            Some(_) => {}
        }
        let mut rgb = frame_image::to_rgb8(&image);
        drop(image);
        let (pw, ph) = pad_even(&mut rgb, w, h);
        let path = dir.path().join(format!("{:06}.png", i + 1));
        write_png(&path, pw, ph, &rgb).map_err(io(format!("cannot write {}", path.display())))?;
    }
    let (w, h) = size.unwrap_or((0, 0));
    let out = dir.path().join("preview.mp4");
    let log = dir.path().join("ffmpeg.log");
    run(
        ffmpeg,
        &ffmpeg_args(dir.path(), fps, &out),
        Some(&log),
        deadline,
    )?;
    let bytes = std::fs::read(&out).map_err(io(format!("cannot read {}", out.display())))?;
    tracing::info!(
        frames = frames.len(),
        bytes = bytes.len(),
        ms = started.elapsed().as_millis() as u64,
        "preview encoded"
    );
    Ok(Encoded {
        bytes,
        frames: frames.len() as u32,
        width: w + w % 2,
        height: h + h % 2,
    })
}

/// Writes an 8-bit RGB PNG, compressed for speed: ffmpeg reads it once.
fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> std::io::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Fast);
    let mut writer = enc.write_header().map_err(std::io::Error::other)?;
    writer
        .write_image_data(rgb)
        .map_err(std::io::Error::other)?;
    writer.finish().map_err(std::io::Error::other)
}

/// Runs ffmpeg with `args` until it exits or `deadline` passes (then it is
/// killed); its output goes to `log` (or nowhere), never to a pipe nobody
/// reads.
fn run(
    ffmpeg: &Ffmpeg,
    args: &[std::ffi::OsString],
    log: Option<&Path>,
    deadline: Instant,
) -> Result<(), PreviewError> {
    let program = ffmpeg.program.display().to_string();
    let mut cmd = Command::new(&ffmpeg.program);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null());
    match log {
        Some(path) => {
            let f = std::fs::File::create(path)
                .map_err(io(format!("cannot write {}", path.display())))?;
            cmd.stderr(f);
        }
        None => {
            cmd.stderr(Stdio::null());
        }
    }
    let mut child = cmd.spawn().map_err(|source| PreviewError::NoFfmpeg {
        program: program.clone(),
        source,
    })?;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let text = log
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .unwrap_or_default();
                return Err(PreviewError::FfmpegFailed {
                    program,
                    status: status.to_string(),
                    log: tail(&text),
                });
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PreviewError::TimedOut {
                    secs: ffmpeg.timeout.as_secs(),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io(format!("cannot wait for {program}"))(e));
            }
        }
    }
}

/// The last few lines of ffmpeg's output, on one line.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(3);
    let t = lines[start..].join(" / ");
    if t.is_empty() {
        "it printed nothing".into()
    } else {
        t.chars().take(600).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blobs::MemoryBlobStore;
    use crate::digest::Digest;

    #[test]
    fn odd_sides_gain_a_copy_of_the_last_column_and_row() {
        // 3x1: red, green, blue.
        let mut rgb = vec![255, 0, 0, 0, 255, 0, 0, 0, 255];
        assert_eq!(pad_even(&mut rgb, 3, 1), (4, 2));
        let row = [255, 0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 255];
        assert_eq!(&rgb[..12], &row);
        assert_eq!(&rgb[12..], &row);
        let mut even = vec![7; 2 * 2 * 3];
        assert_eq!(pad_even(&mut even, 2, 2), (2, 2));
        assert_eq!(even, vec![7; 12]);
    }

    #[test]
    fn ffmpeg_is_told_the_frame_rate_h264_yuv420p_and_faststart() {
        let args = ffmpeg_args(Path::new("/t"), 12.0, Path::new("/t/out.mp4"));
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let after = |k: &str| {
            let i = args.iter().position(|a| a == k).unwrap();
            args[i + 1].clone()
        };
        assert_eq!(after("-framerate"), "12");
        assert_eq!(after("-i"), "/t/%06d.png");
        assert_eq!(after("-c:v"), "libx264");
        assert_eq!(after("-pix_fmt"), "yuv420p");
        assert_eq!(after("-movflags"), "+faststart");
        assert_eq!(args.last().unwrap(), "/t/out.mp4");
        let args = ffmpeg_args(Path::new("/t"), 29.97, Path::new("/o.mp4"));
        assert!(args.iter().any(|a| a == "29.97"));
    }

    #[test]
    fn a_missing_ffmpeg_is_named_with_how_to_install_it() {
        let blobs = MemoryBlobStore::default();
        let frame = FrameOutput {
            frame: 1,
            digest: Digest::of(b"f"),
            ext: "png".into(),
            size: 1,
            pass: String::new(),
        };
        let ffmpeg = Ffmpeg {
            program: PathBuf::from("/nonexistent/ffmpeg"),
            timeout: Duration::from_secs(5),
        };
        let scratch = tempfile::tempdir().unwrap();
        let e = encode(
            &[frame],
            &blobs,
            24.0,
            &ffmpeg,
            PixelLimit::default(),
            scratch.path(),
        )
        .unwrap_err();
        let msg = e.for_job(7);
        assert!(matches!(e, PreviewError::NoFfmpeg { .. }), "{e}");
        assert!(msg.contains("/nonexistent/ffmpeg"), "{msg}");
        assert!(msg.contains("apt-get install ffmpeg"), "{msg}");
        assert!(msg.contains("--ffmpeg"), "{msg}");
        assert!(msg.contains("tessera preview 7"), "{msg}");
        let e = encode(
            &[],
            &blobs,
            24.0,
            &ffmpeg,
            PixelLimit::default(),
            scratch.path(),
        )
        .unwrap_err();
        assert!(matches!(e, PreviewError::NoFrames), "{e}");
    }

    #[test]
    fn a_program_that_fails_is_reported_with_what_it_printed() {
        // `false` starts and fails like an ffmpeg without what it needs.
        let ffmpeg = Ffmpeg {
            program: PathBuf::from("false"),
            timeout: Duration::from_secs(5),
        };
        let e = run(&ffmpeg, &[], None, Instant::now() + ffmpeg.timeout).unwrap_err();
        assert!(matches!(e, PreviewError::FfmpegFailed { .. }), "{e}");
        assert!(e.to_string().contains("it printed nothing"), "{e}");
    }

    #[test]
    fn a_program_past_its_time_is_stopped() {
        let ffmpeg = Ffmpeg {
            program: PathBuf::from("sleep"),
            timeout: Duration::from_millis(200),
        };
        let started = Instant::now();
        let e = run(
            &ffmpeg,
            &["30".into()],
            None,
            Instant::now() + ffmpeg.timeout,
        )
        .unwrap_err();
        assert!(matches!(e, PreviewError::TimedOut { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
