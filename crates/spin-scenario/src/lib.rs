//! Every file format of multispin, in one place: scenario files (paper A, paper B, unified), drop files and the
//! reproduction configs (`scenarios/paper-{a,b}.toml`).
//!
//! One set of rules for all of them (docs/cli.md): parsing is strict (unknown, misspelt and duplicate fields are
//! refused), every error names its field path (`devices[2].acceptance: …`), and every quantity users write in
//! logarithmic units takes either unit of its pair (`bandwidth_hz | bandwidth_mhz`, `ul_power_w | ul_power_dbm`,
//! `noise_psd_server_w_per_hz | noise_psd_server_dbm_per_hz`, `channel_gain | channel_gain_db`), exactly one, the
//! conversions being `spin_channel::units`.
//!
//! The crate parses text (`&str` and a [`Format`]); reading files is the binaries' work. The serialisable file
//! types live here and convert into the plain SI types of `spin-optimize` and `spin-channel`, which know nothing of
//! files.

pub mod drop;
pub mod error;
pub mod pair;
pub mod reader;
pub mod repro;
pub mod scenario;
pub mod unified;

pub use error::FileError;
pub use reader::Format;
pub use scenario::{Loaded, PaperA, parse, parse_expecting};
pub use unified::UnifiedScenario;
