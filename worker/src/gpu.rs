//! Probing the machine's GPUs.
//!
//! Vulkan (through ash, with `libvulkan.so.1` loaded at run time) says what
//! each device is, for every vendor; NVML (`libnvidia-ml.so.1`, also loaded at
//! run time) adds the compute capability and live telemetry of NVIDIA GPUs.
//! Neither library is needed to build or to start the worker: whatever is
//! missing becomes a note in [`Hardware::notes`], never an error.
//!
//! Vulkan and NVML are joined on the device UUID: NVML's `GPU-xxxxxxxx-...`
//! string is the Vulkan `deviceUUID` of the same NVIDIA GPU. Other vendors'
//! UUIDs are reported as plain hex and are not always identities (Mesa's
//! lavapipe reports its version string, the same on every machine).

use ash::vk;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::Nvml;

const VENDOR_NVIDIA: u32 = 0x10de;
const VENDOR_AMD: u32 = 0x1002;
const VENDOR_INTEL: u32 = 0x8086;
const VENDOR_APPLE: u32 = 0x106b;
/// `VK_VENDOR_ID_MESA`: Mesa's software drivers (lavapipe) use it.
const VENDOR_MESA: u32 = 0x10005;

/// What one GPU is and, where NVML is present, how it is doing.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// Position in Vulkan enumeration order.
    pub index: u32,
    /// The driver's device name, e.g. `NVIDIA GeForce RTX 4090`.
    pub name: String,
    /// "NVIDIA", "AMD", "Intel", "Mesa", "Apple", or the id as `0x1234`.
    pub vendor: String,
    /// The PCI (or Khronos) vendor id Vulkan reports.
    pub vendor_id: u32,
    /// "discrete", "integrated", "virtual", "cpu" or "other".
    pub device_type: String,
    /// Sum of the device-local memory heaps.
    pub memory_bytes: u64,
    /// NVIDIA: NVML's `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`; others: 32
    /// lowercase hex chars; empty where the device predates Vulkan 1.1.
    pub uuid: String,
    /// CUDA compute capability (major, minor), from NVML when matched.
    pub compute_capability: Option<(u32, u32)>,
    /// Telemetry read during the probe, where NVML matched the device.
    pub telemetry: Option<Telemetry>,
}

/// One reading of a GPU's load and health, from NVML.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Telemetry {
    /// Percent of the last sample period in which a kernel was running.
    pub utilization_pct: u32,
    /// Device memory in use, by any process.
    pub memory_used_bytes: u64,
    /// Die temperature in degrees Celsius.
    pub temperature_c: u32,
    /// Power draw in watts.
    pub power_w: f64,
    /// Volatile ECC errors, corrected + uncorrected; 0 where ECC is unsupported.
    pub ecc_errors: u64,
    /// Of `ecc_errors`, the uncorrected ones (data corrupted).
    pub ecc_uncorrected: u64,
}

/// The machine's GPUs, probed once; NVML kept open for telemetry.
#[derive(Debug)]
pub struct Hardware {
    nvml: Option<Nvml>,
    gpus: Vec<GpuInfo>,
    notes: Vec<String>,
}

impl Hardware {
    /// Probes with Vulkan (ash, libvulkan loaded at run time) and NVML
    /// (libnvidia-ml loaded at run time). Never panics and never fails: what
    /// is missing becomes a note.
    pub fn probe() -> Self {
        let mut notes = Vec::new();
        let mut gpus = match vulkan_devices() {
            Ok(gpus) => {
                notes.push(format!("found {} Vulkan device(s)", gpus.len()));
                gpus
            }
            Err(note) => {
                notes.push(note);
                Vec::new()
            }
        };
        let nvml = match Nvml::init() {
            Ok(nvml) => {
                match_nvml(&nvml, &mut gpus, &mut notes);
                Some(nvml)
            }
            Err(e) => {
                notes.push(format!("NVML not available: {e}"));
                None
            }
        };
        Self { nvml, gpus, notes }
    }

    /// The GPUs found, in Vulkan enumeration order.
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// What the probe found missing or odd, for logs and `tessera worker --probe`.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Fresh telemetry for each GPU (None where NVML has no match), in `gpus()` order.
    pub fn telemetry(&self) -> Vec<Option<Telemetry>> {
        self.gpus
            .iter()
            .map(|gpu| {
                let nvml = self.nvml.as_ref()?;
                if !gpu.is_nvidia() || gpu.uuid.is_empty() {
                    return None;
                }
                let device = nvml.device_by_uuid(gpu.uuid.as_str()).ok()?;
                Some(read_telemetry(&device))
            })
            .collect()
    }
}

impl GpuInfo {
    /// Whether the GPU is NVIDIA's (by Vulkan vendor id).
    pub fn is_nvidia(&self) -> bool {
        self.vendor_id == VENDOR_NVIDIA
    }

    /// OptiX needs an NVIDIA GPU of compute capability 5.0 or later (Blender
    /// 3.x). Without NVML the capability is unknown, so the answer is no.
    pub fn supports_optix(&self) -> bool {
        self.is_nvidia() && self.compute_capability.is_some_and(|cc| cc >= (5, 0))
    }
}

/// Fills in compute capability and telemetry for the NVIDIA GPUs NVML knows.
fn match_nvml(nvml: &Nvml, gpus: &mut [GpuInfo], notes: &mut Vec<String>) {
    let mut matched = 0;
    for gpu in gpus.iter_mut().filter(|gpu| gpu.is_nvidia()) {
        match nvml.device_by_uuid(gpu.uuid.as_str()) {
            Ok(device) => {
                matched += 1;
                gpu.compute_capability = device.cuda_compute_capability().ok().and_then(|cc| {
                    Some((u32::try_from(cc.major).ok()?, u32::try_from(cc.minor).ok()?))
                });
                gpu.telemetry = Some(read_telemetry(&device));
            }
            Err(e) => notes.push(format!(
                "NVML has no device with uuid {:?} (Vulkan device {}, {}): {e}",
                gpu.uuid, gpu.index, gpu.name
            )),
        }
    }
    // A GPU NVML sees but Vulkan does not usually means a missing Vulkan ICD.
    if let Ok(count) = nvml.device_count() {
        if count > matched {
            notes.push(format!(
                "NVML sees {count} GPU(s) but only {matched} matched a Vulkan device; \
                 check that the NVIDIA Vulkan driver (ICD) is installed"
            ));
        }
    }
}

/// Reads what NVML offers; a reading the device does not support is 0.
fn read_telemetry(device: &nvml_wrapper::Device<'_>) -> Telemetry {
    Telemetry {
        utilization_pct: device.utilization_rates().map_or(0, |u| u.gpu),
        memory_used_bytes: device.memory_info().map_or(0, |m| m.used),
        temperature_c: device.temperature(TemperatureSensor::Gpu).unwrap_or(0),
        power_w: device
            .power_usage()
            .map_or(0.0, |milliwatts| f64::from(milliwatts) / 1000.0),
        ecc_errors: [MemoryError::Corrected, MemoryError::Uncorrected]
            .into_iter()
            .filter_map(|kind| device.total_ecc_errors(kind, EccCounter::Volatile).ok())
            .sum(),
        ecc_uncorrected: device
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap_or(0),
    }
}

/// Lists the Vulkan physical devices, or says in a note why it could not.
fn vulkan_devices() -> Result<Vec<GpuInfo>, String> {
    let vulkan = VulkanProbe::open()?;
    let devices = vulkan
        .physical_devices()
        .map_err(|e| format!("could not list Vulkan devices: {e}"))?;
    Ok(devices
        .into_iter()
        .zip(0..)
        .map(|(device, index)| vulkan.describe(index, device))
        .collect())
}

/// Loads `libvulkan.so.1`.
#[allow(unsafe_code)]
fn load_vulkan() -> Result<ash::Entry, ash::LoadingError> {
    // SAFETY: loading the Vulkan loader runs its library initialisers, which
    // have no preconditions; the returned `Entry` keeps the library loaded for
    // as long as anything made from it is alive.
    unsafe { ash::Entry::load() }
}

/// A Vulkan instance that lives only for the probe; dropping it destroys the
/// instance (before the loader library is unloaded: fields drop after `drop`).
struct VulkanProbe {
    instance: ash::Instance,
    /// The API version the instance was created with.
    api_version: u32,
    _entry: ash::Entry,
}

impl VulkanProbe {
    /// Loads the loader and creates an instance with no layers or extensions.
    #[allow(unsafe_code)]
    fn open() -> Result<Self, String> {
        let entry = load_vulkan().map_err(|e| {
            format!(
                "no Vulkan loader (libvulkan.so.1): {e}; install libvulkan1 and a Vulkan driver"
            )
        })?;
        // SAFETY: `entry` holds a loaded loader; the call takes no pointers of ours.
        let loader_version = unsafe { entry.try_enumerate_instance_version() };
        // A 1.0 loader rejects an instance asking for 1.1: ask for what it has.
        let api_version = match loader_version {
            Ok(Some(version)) if at_least_1_1(version) => vk::API_VERSION_1_1,
            _ => vk::API_VERSION_1_0,
        };
        let app = vk::ApplicationInfo::default()
            .application_name(c"tessera-worker")
            .api_version(api_version);
        let create_info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: `create_info` and `app` are valid and outlive the call; no
        // allocation callbacks; the instance is destroyed in `Drop`.
        let instance = unsafe { entry.create_instance(&create_info, None) }.map_err(|e| {
            format!(
                "could not create a Vulkan instance: {e}; install a Vulkan driver \
                 (mesa-vulkan-drivers for the CPU, or the GPU vendor's)"
            )
        })?;
        Ok(Self {
            instance,
            api_version,
            _entry: entry,
        })
    }

    #[allow(unsafe_code)]
    fn physical_devices(&self) -> Result<Vec<vk::PhysicalDevice>, vk::Result> {
        // SAFETY: the instance is alive for as long as `self`.
        unsafe { self.instance.enumerate_physical_devices() }
    }

    /// Describes one device; telemetry and compute capability come later, from NVML.
    #[allow(unsafe_code)]
    fn describe(&self, index: u32, device: vk::PhysicalDevice) -> GpuInfo {
        // SAFETY: `device` was enumerated from this live instance.
        let props = unsafe { self.instance.get_physical_device_properties(device) };
        let uuid_bytes = if at_least_1_1(self.api_version) && at_least_1_1(props.api_version) {
            let mut id = vk::PhysicalDeviceIDProperties::default();
            let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
            // SAFETY: both the instance and the device support Vulkan 1.1, where
            // this call is core; `props2` chains only `id`, which outlives the call.
            unsafe {
                self.instance
                    .get_physical_device_properties2(device, &mut props2)
            };
            Some(id.device_uuid)
        } else {
            None
        };
        // SAFETY: `device` was enumerated from this live instance.
        let memory = unsafe { self.instance.get_physical_device_memory_properties(device) };
        let memory_bytes = memory
            .memory_heaps_as_slice()
            .iter()
            .filter(|heap| heap.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|heap| heap.size)
            .sum();
        let name = props
            .device_name_as_c_str()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        GpuInfo {
            index,
            name,
            vendor: vendor_name(props.vendor_id),
            vendor_id: props.vendor_id,
            device_type: device_type_name(props.device_type).to_owned(),
            memory_bytes,
            uuid: uuid_bytes.map_or_else(String::new, |bytes| {
                format_uuid(&bytes, props.vendor_id == VENDOR_NVIDIA)
            }),
            compute_capability: None,
            telemetry: None,
        }
    }
}

impl Drop for VulkanProbe {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: nothing made from the instance outlives the probe (physical
        // device handles are not kept), and it is destroyed exactly once.
        unsafe { self.instance.destroy_instance(None) };
    }
}

fn at_least_1_1(version: u32) -> bool {
    (
        vk::api_version_major(version),
        vk::api_version_minor(version),
    ) >= (1, 1)
}

/// The vendor's usual name, or its id in hex where it is not one we know.
fn vendor_name(vendor_id: u32) -> String {
    match vendor_id {
        VENDOR_NVIDIA => "NVIDIA".to_owned(),
        VENDOR_AMD => "AMD".to_owned(),
        VENDOR_INTEL => "Intel".to_owned(),
        VENDOR_MESA => "Mesa".to_owned(),
        VENDOR_APPLE => "Apple".to_owned(),
        other => format!("{other:#06x}"),
    }
}

fn device_type_name(device_type: vk::PhysicalDeviceType) -> &'static str {
    match device_type {
        vk::PhysicalDeviceType::DISCRETE_GPU => "discrete",
        vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated",
        vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual",
        vk::PhysicalDeviceType::CPU => "cpu",
        _ => "other",
    }
}

/// NVIDIA UUIDs in NVML's form (`GPU-` + 8-4-4-4-12), so the two can be
/// compared as strings; other vendors' as 32 lowercase hex chars.
fn format_uuid(bytes: &[u8; 16], nvml_form: bool) -> String {
    let hex = |range: std::ops::Range<usize>| -> String {
        bytes[range].iter().map(|b| format!("{b:02x}")).collect()
    };
    if nvml_form {
        format!(
            "GPU-{}-{}-{}-{}-{}",
            hex(0..4),
            hex(4..6),
            hex(6..8),
            hex(8..10),
            hex(10..16)
        )
    } else {
        hex(0..16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] = [
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0xcc, 0xdd, 0xee,
        0xff,
    ];

    fn gpu(vendor_id: u32, compute_capability: Option<(u32, u32)>) -> GpuInfo {
        GpuInfo {
            index: 0,
            name: "test".to_owned(),
            vendor: vendor_name(vendor_id),
            vendor_id,
            device_type: "discrete".to_owned(),
            memory_bytes: 1 << 30,
            uuid: String::new(),
            compute_capability,
            telemetry: None,
        }
    }

    #[test]
    fn nvidia_uuid_takes_nvml_form() {
        assert_eq!(
            format_uuid(&BYTES, true),
            "GPU-00010203-0405-0607-0809-0a0bccddeeff"
        );
    }

    #[test]
    fn other_uuids_are_plain_lowercase_hex() {
        let uuid = format_uuid(&BYTES, false);
        assert_eq!(uuid, "000102030405060708090a0bccddeeff");
        assert_eq!(uuid.len(), 32);
    }

    #[test]
    fn vendor_names() {
        assert_eq!(vendor_name(0x10de), "NVIDIA");
        assert_eq!(vendor_name(0x1002), "AMD");
        assert_eq!(vendor_name(0x8086), "Intel");
        assert_eq!(vendor_name(0x10005), "Mesa");
        assert_eq!(vendor_name(0x106b), "Apple");
        assert_eq!(vendor_name(0x1234), "0x1234");
        assert_eq!(vendor_name(0x13b5), "0x13b5");
    }

    #[test]
    fn device_type_names() {
        use vk::PhysicalDeviceType as T;
        assert_eq!(device_type_name(T::DISCRETE_GPU), "discrete");
        assert_eq!(device_type_name(T::INTEGRATED_GPU), "integrated");
        assert_eq!(device_type_name(T::VIRTUAL_GPU), "virtual");
        assert_eq!(device_type_name(T::CPU), "cpu");
        assert_eq!(device_type_name(T::OTHER), "other");
        assert_eq!(device_type_name(T::from_raw(99)), "other");
    }

    #[test]
    fn optix_needs_nvidia_with_compute_capability_5_or_later() {
        assert!(gpu(VENDOR_NVIDIA, Some((5, 0))).supports_optix());
        assert!(gpu(VENDOR_NVIDIA, Some((9, 0))).supports_optix());
        assert!(!gpu(VENDOR_NVIDIA, Some((3, 5))).supports_optix());
        assert!(!gpu(VENDOR_NVIDIA, Some((4, 9))).supports_optix());
        assert!(
            !gpu(VENDOR_NVIDIA, None).supports_optix(),
            "unknown capability"
        );
        assert!(!gpu(VENDOR_AMD, Some((8, 6))).supports_optix());
        assert!(gpu(VENDOR_NVIDIA, None).is_nvidia());
        assert!(!gpu(VENDOR_MESA, None).is_nvidia());
    }

    #[test]
    fn api_version_check() {
        assert!(!at_least_1_1(vk::API_VERSION_1_0));
        assert!(at_least_1_1(vk::API_VERSION_1_1));
        assert!(at_least_1_1(vk::API_VERSION_1_3));
        assert!(at_least_1_1(vk::make_api_version(0, 2, 0, 0)));
    }

    /// Whether Mesa's lavapipe ICD is installed (Debian: mesa-vulkan-drivers).
    fn lavapipe_installed() -> bool {
        ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"]
            .iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flatten()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().starts_with("lvp_icd"))
    }

    #[test]
    fn probe_finds_lavapipe_or_reports_the_missing_loader() {
        let hardware = Hardware::probe();
        println!("gpus: {:#?}", hardware.gpus());
        println!("notes: {:#?}", hardware.notes());
        assert_eq!(hardware.telemetry().len(), hardware.gpus().len());

        if load_vulkan().is_err() {
            println!("branch: no Vulkan loader");
            assert!(hardware.gpus().is_empty());
            assert!(
                hardware.notes().iter().any(|n| n.contains("libvulkan")),
                "no note names libvulkan: {:?}",
                hardware.notes()
            );
        } else if lavapipe_installed() {
            println!("branch: lavapipe");
            let lavapipe = hardware
                .gpus()
                .iter()
                .find(|g| g.device_type == "cpu" && g.name.contains("llvmpipe"))
                .expect("lavapipe is installed but no llvmpipe CPU device was found");
            assert!(lavapipe.memory_bytes > 0);
            assert_eq!(lavapipe.uuid.len(), 32, "lavapipe reports Vulkan 1.1+");
            assert!(!lavapipe.supports_optix());
            assert!(hardware
                .notes()
                .iter()
                .any(|n| n.ends_with("Vulkan device(s)")));
        } else {
            println!(
                "branch: Vulkan loader without lavapipe; skipping the llvmpipe checks \
                 (apt-get install mesa-vulkan-drivers to run them)"
            );
            for gpu in hardware.gpus() {
                assert!(!gpu.name.is_empty());
            }
        }
    }
}
