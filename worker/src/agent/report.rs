//! What a worker tells the coordinator about itself: its slots, GPUs,
//! telemetry and memory.

use super::*;

pub(super) fn slot_info(p: &SlotPlan) -> pb::SlotInfo {
    pb::SlotInfo {
        slot: p.slot,
        device: p.device.name().into(),
        gpu: p.gpu,
        vram_bytes: p.vram_bytes,
    }
}

/// The GPUs as protocol messages, with `telemetry` (by GPU index) when given.
pub(super) fn gpu_messages(
    hw: &HardwareConfig,
    telemetry: Option<&[Option<Telemetry>]>,
) -> Vec<pb::Gpu> {
    hw.gpus
        .iter()
        .enumerate()
        .map(|(i, g)| pb::Gpu {
            index: g.index,
            name: g.name.clone(),
            vendor: g.vendor.clone(),
            device_type: g.device_type.clone(),
            memory_bytes: g.memory_bytes,
            uuid: g.uuid.clone(),
            telemetry: telemetry
                .and_then(|t| t.get(i).copied().flatten())
                .or(g.telemetry)
                .map(|t| pb::Telemetry {
                    utilization_pct: t.utilization_pct,
                    memory_used_bytes: t.memory_used_bytes,
                    temperature_c: t.temperature_c,
                    power_w: t.power_w,
                    ecc_errors: t.ecc_errors,
                    ecc_uncorrected: t.ecc_uncorrected,
                }),
        })
        .collect()
}

/// Fresh telemetry of every GPU: NVML for probed ones, the declared file for the others.
fn read_telemetry(hw: &HardwareConfig) -> Vec<Option<Telemetry>> {
    let mut all: Vec<Option<Telemetry>> = match &hw.probe {
        Some(p) => p.telemetry(),
        None => Vec::new(),
    };
    all.resize(hw.probed, None);
    let declared = hw.gpus.len() - hw.probed;
    #[cfg(feature = "test-hooks")]
    let mut from_file = hw
        .declared_telemetry
        .as_deref()
        .map(crate::slots::read_declared_telemetry)
        .unwrap_or_default();
    #[cfg(not(feature = "test-hooks"))]
    let mut from_file = Vec::new();
    from_file.resize(declared, None);
    all.extend(from_file);
    all
}

pub(super) async fn send_telemetry<R: Renderer>(shared: &Shared<R>) {
    let changed: Vec<u32> = std::mem::take(&mut *shared.changed.lock().unwrap());
    let plans = shared.plans.lock().unwrap().clone();
    let hw = &shared.config.hardware;
    let telemetry = if hw.gpus.is_empty() {
        Vec::new()
    } else {
        read_telemetry(hw)
    };
    if hw.gpus.is_empty() && changed.is_empty() {
        return;
    }
    let req = pb::TelemetryRequest {
        worker_id: shared.worker_id.read().await.clone(),
        gpus: gpu_messages(hw, Some(&telemetry)),
        slot_info: plans
            .iter()
            .filter(|p| changed.contains(&p.slot))
            .map(slot_info)
            .collect(),
    };
    let mut client = pb::work_client::WorkClient::new(shared.channel.clone());
    if let Err(s) = client.telemetry(req).await {
        tracing::debug!("cannot send telemetry: {}", s.message());
        shared.changed.lock().unwrap().extend(changed);
    }
}

/// Total system memory, from /proc/meminfo.
pub(super) fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}
