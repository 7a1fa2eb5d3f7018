//! Blocking entry points for the binaries (which do not depend on tokio): each builds a multi-threaded runtime,
//! turns ctrl-c into a clean shutdown, and runs the server, the simulation or a device to completion.

use crate::device::{DeviceConfig, DeviceReport, run_device};
use crate::error::{NetError, Result};
use crate::proto::Identity;
use crate::server::{RoundTrace, Server, ServerConfig, Summary};
use crate::sim::{SimDevice, SimOutcome, simulate};
use spin_runtime::Model;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// A shutdown flag that turns true on ctrl-c.
fn ctrl_c(rt: &tokio::runtime::Runtime) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = tx.send(true);
        }
    });
    rx
}

/// [`simulate`] on a fresh runtime; ctrl-c ends the run after the current round (the summary says "shutdown").
pub fn simulate_blocking(
    target: Arc<Model>,
    drafter: Arc<Model>,
    drafter_identity: Identity,
    cfg: ServerConfig,
    devices: &[SimDevice],
    on_round: impl FnMut(&RoundTrace),
) -> Result<SimOutcome> {
    let rt = runtime()?;
    let shutdown = ctrl_c(&rt);
    rt.block_on(simulate(
        target,
        drafter,
        drafter_identity,
        cfg,
        devices,
        shutdown,
        on_round,
    ))
}

/// Runs `f` (a server-side baseline, `crate::baselines`) with a stop flag that turns true on ctrl-c.
pub fn with_ctrl_c<T>(f: impl FnOnce(&dyn Fn() -> bool) -> Result<T>) -> Result<T> {
    let rt = runtime()?;
    let shutdown = ctrl_c(&rt);
    f(&|| *shutdown.borrow())
}

/// Serves on `listener` (bound by the caller, e.g. before the target loaded), reports its address to
/// `on_listening`, and serves until done or ctrl-c; the server's operator notices (whom it waits for) go to
/// `on_notice`.
pub fn serve_blocking(
    listener: std::net::TcpListener,
    target: Arc<Model>,
    cfg: ServerConfig,
    on_listening: impl FnOnce(SocketAddr),
    on_notice: impl FnMut(&str) + Send + 'static,
    on_round: impl FnMut(&RoundTrace),
) -> Result<Summary> {
    let rt = runtime()?;
    let shutdown = ctrl_c(&rt);
    rt.block_on(async move {
        let server = Server::from_std(listener, target, cfg)?.with_notices(on_notice);
        on_listening(server.local_addr()?);
        server.run(shutdown, on_round).await
    })
}

/// Runs a device to completion; ctrl-c ends it with [`NetError::Shutdown`].
pub fn device_blocking(model: Arc<Model>, cfg: DeviceConfig) -> Result<DeviceReport> {
    let rt = runtime()?;
    let mut shutdown = ctrl_c(&rt);
    rt.block_on(async move {
        tokio::select! {
            r = run_device(model, cfg) => r,
            _ = shutdown.wait_for(|s| *s) => Err(NetError::Shutdown("interrupted (ctrl-c)".into())),
        }
    })
}
