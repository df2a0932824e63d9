//! What this worker's Blender can render: its version and the features a
//! scene may need (OpenImageDenoise, OSL, Eevee), asked of Blender itself
//! once at start. The coordinator leases a job only to workers whose
//! Blender has what the job's scene uses.

use std::path::Path;

use crate::error::Error;

/// Feature names, as jobs require them and workers report them.
pub mod feature {
    /// Cycles' OpenImageDenoise denoiser.
    pub const OIDN: &str = "openimagedenoise";
    /// Open Shading Language in Cycles.
    pub const OSL: &str = "osl";
    /// Cycles' OptiX denoiser (a worker with an OptiX slot).
    pub const OPTIX_DENOISE: &str = "optix-denoise";
    /// The Eevee engine (Blender 3.x needs a display or EGL to run it).
    pub const EEVEE: &str = "eevee";
    /// The worker runs a scene's stored Python when a job asks for it
    /// (`tessera worker --allow-scene-python`): an admin's choice, not a
    /// property of its Blender.
    pub const SCENE_PYTHON: &str = "scene-python";
}

/// What a worker's Blender offers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlenderCaps {
    /// `3.4.1`.
    pub version: String,
    /// Feature names (see [`feature`]).
    pub features: Vec<String>,
}

/// The script Blender runs to report its build.
const PROBE: &str = "import bpy, _cycles; \
print('TESSERA_CAPS', bpy.app.version_string.split()[0], \
int(bool(getattr(_cycles, 'with_openimagedenoise', False))), \
int(bool(getattr(_cycles, 'with_osl', False))))";

/// Asks `blender` what it can render. `display` says whether Eevee can get a
/// GL context here (an X or Wayland display is set).
pub async fn probe(blender: &Path, display: bool) -> Result<BlenderCaps, Error> {
    let out = tokio::process::Command::new(blender)
        .args([
            "-b",
            "--factory-startup",
            "--python-exit-code",
            "3",
            "--python-expr",
            PROBE,
        ])
        .env_remove("TESSERA_TOKEN")
        .output()
        .await
        .map_err(|e| Error::Blender {
            path: blender.display().to_string(),
            reason: e.to_string(),
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse(&text, display).ok_or_else(|| Error::Blender {
        path: blender.display().to_string(),
        reason: format!(
            "it did not report its build: {}",
            text.lines().rev().take(3).collect::<Vec<_>>().join(" / ")
        ),
    })
}

/// Reads the probe's `TESSERA_CAPS` line.
fn parse(stdout: &str, display: bool) -> Option<BlenderCaps> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TESSERA_CAPS "))?;
    let parts: Vec<&str> = line.split_whitespace().collect();
    let [version, oidn, osl] = parts.as_slice() else {
        return None;
    };
    let mut features = Vec::new();
    if *oidn == "1" {
        features.push(feature::OIDN.to_string());
    }
    if *osl == "1" {
        features.push(feature::OSL.to_string());
    }
    if display {
        features.push(feature::EEVEE.to_string());
    }
    Some(BlenderCaps {
        version: version.to_string(),
        features,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_line_is_read() {
        let caps = parse("Blender 3.4.1\nTESSERA_CAPS 3.4.1 0 1\n", false).unwrap();
        assert_eq!(caps.version, "3.4.1");
        assert_eq!(caps.features, vec!["osl".to_string()]);
        let caps = parse("TESSERA_CAPS 4.2.0 1 0", true).unwrap();
        assert_eq!(
            caps.features,
            vec!["openimagedenoise".to_string(), "eevee".to_string()]
        );
        assert!(parse("Error: nothing", false).is_none());
    }
}
