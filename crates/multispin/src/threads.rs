//! `--threads`, shared by every command that runs models: the size of the one thread pool the process sets up at
//! start-up (docs/cli.md, "Threads").

use crate::failure::Failure;
use clap::Args;

/// The most worker threads `--threads` (and `RAYON_NUM_THREADS`) accepts: the runtime's bound.
pub use spin_runtime::load::MAX_THREADS;

/// The thread count of a command that runs models.
#[derive(Debug, Clone, Args)]
pub struct ThreadArgs {
    /// Worker threads of the CPU products and attention (1 to 256; default: `RAYON_NUM_THREADS` when set, else
    /// the available parallelism, i.e. every core the process may use).
    #[arg(allow_hyphen_values = true, long, global = true)]
    pub threads: Option<usize>,
}

impl ThreadArgs {
    /// Sets up the process's thread pool once (see `spin_runtime::load::set_up_threads`).
    ///
    /// # Safety
    ///
    /// No other thread may exist while it runs: call it first thing in a command's `run`.
    #[allow(unsafe_code)]
    pub unsafe fn set_up(&self) -> Result<String, Failure> {
        if self.threads == Some(0) {
            return Err(Failure::Input("--threads: must be at least 1".into()));
        }
        if let Some(n) = self.threads.filter(|&n| n > MAX_THREADS) {
            return Err(Failure::Input(format!(
                "--threads: {n} exceeds {MAX_THREADS} (the pool's workers poll for work, so threads beyond the cores only slow it down)"
            )));
        }
        // SAFETY: forwarded from the caller. The flag is checked above, so an error here names `RAYON_NUM_THREADS`.
        unsafe { spin_runtime::load::set_up_threads(self.threads) }.map_err(|e| Failure::Input(e.to_string()))
    }
}
