//! Python stored in a scene that Blender did not run, read from its output,
//! and the warnings a job carries for it.
//!
//! Workers run Blender with `--disable-autoexec` unless the job asked for
//! stored Python and the worker allows it. Plain `blender -b scene.blend -f 1`
//! does the same (auto-run is off in Blender's default preferences): a driver
//! whose expression needs more than Blender's restricted namespace is not
//! evaluated, and Blender says so and renders on, exit status 0. Measured with
//! Blender 3.4.1 and 4.5.15, on stderr:
//!
//! ```text
//!     BPY_driver_exec: restricted access disallows name 'context', enable auto-execution to support
//!
//! Error in PyDriver: expression failed: bpy.context.scene.frame_current * 0.1
//! For target: (type=Object, name="Cube", property=location, property_index=2)
//! ```
//!
//! Such a frame equals Blender's own without `-y`, so it is not an error: the
//! job gets a warning naming the driver. A driver whose Python really fails
//! (`int('x')`, which the restricted namespace allows) prints the same
//! `Error in PyDriver` line without the `restricted access` line before it,
//! and a traceback after it: that stays an error.

/// Most drivers remembered per session (a scene may have thousands).
const MAX_DRIVERS: usize = 16;

/// Reads Blender's output for drivers that were skipped because auto-run is off.
#[derive(Debug, Default, Clone)]
pub struct SkippedDrivers {
    /// The last line refused a name for lack of auto-run; the next
    /// `Error in PyDriver` belongs to that driver.
    restricted: bool,
    /// The last line was a skipped driver's error: a `For target` line names it.
    named_next: bool,
    /// Skipped drivers: (expression, what it drives), in order of appearance.
    drivers: Vec<(String, String)>,
}

impl SkippedDrivers {
    /// Notes one line of Blender's output. Returns true when the line is part
    /// of Blender's report of a skipped driver, so not an error.
    pub fn note(&mut self, line: &str) -> bool {
        let l = line.trim();
        if l.contains("restricted access disallows name") {
            self.restricted = true;
            self.named_next = false;
            return true;
        }
        if let Some(rest) = l.strip_prefix("Error in PyDriver:") {
            self.named_next = false;
            if !std::mem::take(&mut self.restricted) {
                return false;
            }
            let expr = rest
                .trim()
                .strip_prefix("expression failed:")
                .unwrap_or(rest)
                .trim()
                .to_string();
            if self.drivers.len() < MAX_DRIVERS && !self.drivers.iter().any(|(e, _)| *e == expr) {
                self.drivers.push((expr, String::new()));
                self.named_next = true;
            }
            return true;
        }
        if let Some(target) = l.strip_prefix("For target:") {
            if std::mem::take(&mut self.named_next) {
                if let Some(d) = self.drivers.last_mut() {
                    d.1 = describe_target(target.trim());
                }
                return true;
            }
            return false;
        }
        // Other lines leave the pairing alone: stdout (progress) and stderr
        // (these reports) reach the worker interleaved, while Blender prints
        // a driver's two lines to stderr back to back.
        false
    }

    /// One warning per skipped driver.
    pub fn warnings(&self) -> Vec<String> {
        self.drivers
            .iter()
            .map(|(expr, target)| {
                let on = if target.is_empty() {
                    String::new()
                } else {
                    format!(" on {target}")
                };
                format!(
                    "driver `{expr}`{on} needs auto-run Python, which this worker does not run: \
                     it was not evaluated, as in `blender -b` without `-y`, so the frames equal \
                     Blender's without `-y`; to run it, submit with --scene-python (it then runs \
                     only on workers started with --allow-scene-python)"
                )
            })
            .collect()
    }
}

/// `Object "Cube" location[2]` from Blender's
/// `(type=Object, name="Cube", property=location, property_index=2)`; the
/// text as it is when it reads otherwise. A name may hold `, ` or quotes.
fn describe_target(target: &str) -> String {
    let parsed = (|| {
        let inner = target.strip_prefix("(type=")?.strip_suffix(')')?;
        let (kind, rest) = inner.split_once(", name=\"")?;
        let (name, rest) = rest.rsplit_once("\", property=")?;
        let (property, index) = match rest.split_once(", property_index=") {
            Some((p, i)) => (p, format!("[{i}]")),
            None => (rest, String::new()),
        };
        Some(format!("{kind} \"{name}\" {property}{index}"))
    })();
    parsed.unwrap_or_else(|| target.to_string())
}

/// The warning for text blocks registered to run on load that Blender skipped.
pub fn scripts_warning(names: &[String]) -> Option<String> {
    if names.is_empty() {
        return None;
    }
    let list: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    Some(format!(
        "text block(s) {} are registered to run when the scene opens; this worker does not \
         run stored Python, as `blender -b` without `-y` does not, so the frames equal \
         Blender's without `-y`; to run them, submit with --scene-python (it then runs only on \
         workers started with --allow-scene-python)",
        list.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_skipped_for_lack_of_auto_run_is_a_warning_not_an_error() {
        let mut d = SkippedDrivers::default();
        let lines = [
            "\tBPY_driver_exec: restricted access disallows name 'context', enable auto-execution to support",
            "",
            "Error in PyDriver: expression failed: bpy.context.scene.frame_current * 0.1",
            "For target: (type=Object, name=\"Cube\", property=location, property_index=2)",
            "",
            "Saved: '/tmp/frame_0001.png'",
        ];
        let consumed: Vec<bool> = lines.iter().map(|l| d.note(l)).collect();
        assert_eq!(consumed, [true, false, true, true, false, false]);
        let w = d.warnings();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with(
                "driver `bpy.context.scene.frame_current * 0.1` on Object \"Cube\" location[2] \
                 needs auto-run Python"
            ) && w[0].contains("equal Blender's without `-y`")
                && w[0].contains("--scene-python"),
            "{}",
            w[0]
        );
        // Every frame prints it again: one warning still.
        for l in lines {
            d.note(l);
        }
        assert_eq!(d.warnings().len(), 1);
    }

    #[test]
    fn a_driver_whose_python_fails_stays_an_error() {
        let mut d = SkippedDrivers::default();
        for (line, consumed) in [
            ("Read blend: /tmp/int.blend", false),
            ("", false),
            (
                "Error in PyDriver: expression failed: int('tessera') + frame",
                false,
            ),
            (
                "For target: (type=Object, name=\"Cube\", property=location, property_index=2)",
                false,
            ),
            ("Traceback (most recent call last):", false),
            (
                "ValueError: invalid literal for int() with base 10: 'tessera'",
                false,
            ),
        ] {
            assert_eq!(d.note(line), consumed, "{line}");
        }
        assert!(d.warnings().is_empty());
        // Stdout lines may come between a skipped driver's two lines.
        d.note("BPY_driver_exec: restricted access disallows name 'mode', enable auto-execution");
        assert!(!d.note("Fra:1 Mem:10M | Sample 1/4"));
        assert!(d.note("Error in PyDriver: expression failed: depsgraph.mode == 'RENDER'"));
        assert_eq!(d.warnings().len(), 1);
        // ...and the next driver error is judged on its own again.
        assert!(!d.note("Error in PyDriver: expression failed: int('x')"));
    }

    #[test]
    fn drivers_are_bounded_and_targets_named() {
        let mut d = SkippedDrivers::default();
        for i in 0..40 {
            d.note("BPY_driver_exec: restricted access disallows name 'bpy'");
            d.note(&format!(
                "Error in PyDriver: expression failed: bpy.data.x[{i}]"
            ));
        }
        assert_eq!(d.warnings().len(), MAX_DRIVERS);
        assert_eq!(
            describe_target("(type=Material, name=\"Wood, dark\", property=diffuse_color)"),
            "Material \"Wood, dark\" diffuse_color"
        );
        assert_eq!(describe_target("something else"), "something else");
        assert_eq!(scripts_warning(&[]), None);
        let w = scripts_warning(&["setup.py".to_string()]).unwrap();
        assert!(
            w.contains("\"setup.py\"") && w.contains("without `-y`"),
            "{w}"
        );
    }
}
