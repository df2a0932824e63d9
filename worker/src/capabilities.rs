//! What a Blender can render, by name: the features a job may need and a
//! runtime reports ([`crate::runtime::probe`] asks each runtime at start).
//! The coordinator leases a job only to a runtime that has what the job's
//! scene uses.

/// Feature names, as jobs require them and workers report them.
pub mod feature {
    /// Cycles' OpenImageDenoise denoiser.
    pub const OIDN: &str = "openimagedenoise";
    /// Open Shading Language in Cycles.
    pub const OSL: &str = "osl";
    /// Cycles' OptiX denoiser (a worker with an OptiX slot).
    pub const OPTIX_DENOISE: &str = "optix-denoise";
    /// The EEVEE engine: a tiny EEVEE frame rendered at start (on a headless
    /// machine, through Blender's fallback to surfaceless EGL).
    pub const EEVEE: &str = "eevee";
    /// The worker runs a scene's stored Python when a job asks for it
    /// (`tessera worker --allow-scene-python`): an admin's choice, not a
    /// property of its Blender.
    pub const SCENE_PYTHON: &str = "scene-python";
}
