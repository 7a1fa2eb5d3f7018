//! One-process simulation: a server and K devices in one tokio runtime, talking over real loopback sockets.

use crate::device::{DeviceConfig, DeviceReport, run_device_with_ready};
use crate::error::{NetError, Result};
use crate::proto::Identity;
use crate::server::{RoundTrace, Server, ServerConfig, Summary};
use spin_runtime::Model;
use std::sync::Arc;
use tokio::sync::watch;

/// What a simulation ends with.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    /// The server's totals.
    pub summary: Summary,
    /// Each device's own view (Err when the device failed, e.g. the run ended before it finished).
    pub devices: Vec<std::result::Result<DeviceReport, String>>,
}

/// Per-device options of a simulation.
#[derive(Debug, Clone, Default)]
pub struct SimDevice {
    /// The prompt.
    pub prompt: Vec<u32>,
    /// Distance to the server (None: from the drop).
    pub distance_m: Option<f64>,
    /// Test hook: extra wall delay before each draft.
    pub delay: Option<std::time::Duration>,
    /// Test hook: disconnect after sending this round's draft, then resume.
    pub disconnect_at_round: Option<u64>,
    /// Prompt lookup while drafting ([`DeviceConfig::lookup`]).
    pub lookup: Option<spin_runtime::drafter::Lookup>,
}

/// Runs the server for `target` and one device per entry of `devices` drafting with `drafter`, all on 127.0.0.1.
/// Devices join one after the other (so device k gets index k). `shutdown` stops the run early.
pub async fn simulate(
    target: Arc<Model>,
    drafter: Arc<Model>,
    drafter_identity: Identity,
    mut cfg: ServerConfig,
    devices: &[SimDevice],
    shutdown: watch::Receiver<bool>,
    on_round: impl FnMut(&RoundTrace),
) -> Result<SimOutcome> {
    if devices.is_empty() {
        return Err(NetError::invalid("devices", "at least one device is needed"));
    }
    cfg.min_devices = devices.len();
    cfg.max_devices = cfg.max_devices.max(devices.len());
    // Every device connects from 127.0.0.1 and none drafts before the last joined: the admission limits admit them.
    cfg.max_pending = cfg.max_pending.max(devices.len());
    cfg.max_pending_per_addr = cfg.max_pending_per_addr.max(devices.len());
    cfg.max_connections = cfg.max_connections.max(devices.len() + 16);
    cfg.max_connections_per_addr = cfg.max_connections_per_addr.max(devices.len() + 16);
    let max_frame = cfg.max_frame_bytes;
    // Measured compute on the virtual clock: the devices share this machine's cores, so they draft one at a time
    // and each one's drafting time is that of its own processor (the real clock keeps them concurrent: its
    // rounds last what they last).
    let draft_lock = (cfg.compute == crate::server::Compute::Measured
        && cfg.clock == crate::server::Clock::Virtual)
        .then(|| Arc::new(std::sync::Mutex::new(())));
    let server = Server::bind("127.0.0.1:0", target, cfg).await?;
    let addr = server.local_addr()?.to_string();
    // The server runs in this task (its round callback may borrow); the devices are tasks of their own.
    let serving = server.run(shutdown, on_round);
    let joining = async {
        let mut handles = Vec::with_capacity(devices.len());
        for d in devices {
            let mut dc = DeviceConfig::new(addr.clone(), d.prompt.clone(), drafter_identity);
            dc.distance_m = d.distance_m;
            dc.delay = d.delay;
            dc.disconnect_at_round = d.disconnect_at_round;
            dc.max_frame_bytes = max_frame;
            dc.draft_lock = draft_lock.clone();
            dc.lookup = d.lookup;
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let model = drafter.clone();
            let h = tokio::spawn(run_device_with_ready(model, dc, Some(ready_tx)));
            // Wait until this device is welcomed (or failed) before starting the next: indices follow the list.
            // A device that could not join ends the simulation with its error: the server would wait for it
            // forever (it starts no round before every device has joined). Its own word decides, not whether its
            // task has already ended: on a multi-threaded runtime the signal can arrive first.
            let welcomed = ready_rx.await.unwrap_or(false);
            if !welcomed {
                let i = handles.len();
                match h.await {
                    Ok(Err(e)) => return Err(NetError::invalid(format!("devices[{i}]"), e.to_string())),
                    Err(e) => {
                        return Err(NetError::invalid(
                            format!("devices[{i}]"),
                            format!("device task: {e}"),
                        ));
                    }
                    Ok(Ok(r)) => {
                        handles.push(tokio::spawn(async move { Ok(r) }));
                        continue;
                    }
                }
            }
            handles.push(h);
        }
        let mut reports = Vec::with_capacity(handles.len());
        for h in handles {
            reports.push(match h.await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(format!("device task: {e}")),
            });
        }
        Ok(reports)
    };
    tokio::pin!(serving);
    tokio::pin!(joining);
    let (summary, reports) = tokio::select! {
        reports = &mut joining => {
            let reports = reports?;
            ((&mut serving).await, reports)
        }
        summary = &mut serving => (summary, joining.await?),
    };
    Ok(SimOutcome {
        summary: summary?,
        devices: reports,
    })
}
