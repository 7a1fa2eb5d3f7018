//! `multispin correct`: the reactive step of paper B for one verification outcome (modes and DL powers).

use crate::failure::Failure;
use crate::plan_args::OutputFormat;
use crate::scenario::{self, Loaded};
use clap::{Args, ValueEnum};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use spin_optimize::paper_b::Scenario;
use spin_optimize::paper_b::reactive::{self, Mode, ModeScheme};
use spin_optimize::round::Family;
use std::path::PathBuf;

/// Arguments of `multispin correct`.
///
/// Every rejected device exchanges one distribution of `distribution_bits` bits over an equal share
/// `bandwidth_hz`/|R| of the band, uploading at `ul_power_w` (UL) or receiving a share of `dl_power_w` (DL).
/// Output (JSON): `modes` ("ul"/"dl", one per listed device, in the order given), `dl_power_w` (watts, 0 for UL
/// devices), `comm_delay_s` (seconds, the slower of the parallel UL and DL transfers), plus `ul_delay_s`,
/// `dl_delay_s` and `scheme`.
#[derive(Debug, Args)]
pub struct CorrectArgs {
    /// Paper-B scenario file (`"model": "paper-b"`; fields and units as in `multispin plan --help`).
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
    /// Indices of the devices whose drafts were rejected: comma separated, 0-based, distinct, digits only, no
    /// empty entries (e.g. `0,3,5`; `""` when no draft was rejected).
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub rejected: String,
    /// Mode selection.
    #[arg(long, value_enum, default_value_t = CorrectScheme::Optimal, value_name = "SCHEME")]
    pub scheme: CorrectScheme,
    /// Seed of the random scheme (default: the scenario's `seed`).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
    pub format: OutputFormat,
}

/// The mode-selection schemes of `correct`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CorrectScheme {
    /// Prefix structure and bisection (optimal).
    Optimal,
    /// Every rejected device uploads.
    AllUl,
    /// Every rejected device downloads.
    AllDl,
    /// Each rejected device UL or DL with probability ½.
    Random,
    /// All 2^|R| assignments (|R| ≤ 20): the reference for optimal.
    BruteForce,
}

impl CorrectScheme {
    fn mode_scheme(self) -> ModeScheme {
        match self {
            CorrectScheme::Optimal => ModeScheme::Optimal,
            CorrectScheme::AllUl => ModeScheme::AllUl,
            CorrectScheme::AllDl => ModeScheme::AllDl,
            CorrectScheme::Random => ModeScheme::Random,
            CorrectScheme::BruteForce => ModeScheme::BruteForce,
        }
    }
}

#[derive(Debug, Serialize)]
struct Output {
    scheme: &'static str,
    rejected: Vec<usize>,
    modes: Vec<Mode>,
    dl_power_w: Vec<f64>,
    comm_delay_s: f64,
    ul_delay_s: f64,
    dl_delay_s: f64,
}

/// Parses `0,3,5` into distinct device indices below `devices` (`""`: none). Strict: an empty entry (`1,,2`, `1,`),
/// a sign (`+1`), spaces, duplicates and indices out of range are errors naming the entry.
pub fn parse_rejected(text: &str, devices: usize) -> Result<Vec<usize>, Failure> {
    if text.is_empty() {
        // No device was rejected: nothing to correct (comm_delay_s = 0).
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (i, part) in text.split(',').enumerate() {
        if part.is_empty() {
            return Err(Failure::Input(format!(
                "--rejected: entry {i} is empty in {text:?}"
            )));
        }
        let k = if part.bytes().all(|b| b.is_ascii_digit()) {
            part.parse::<usize>().ok()
        } else {
            None
        };
        let Some(k) = k else {
            return Err(Failure::Input(format!(
                "--rejected: entry {i} {part:?} is not a device index (digits only, 0-based)"
            )));
        };
        if k >= devices {
            return Err(Failure::Input(format!(
                "--rejected: device {k} does not exist (the scenario has {devices}: 0..={})",
                devices - 1
            )));
        }
        if out.contains(&k) {
            return Err(Failure::Input(format!("--rejected: device {k} is listed twice")));
        }
        out.push(k);
    }
    Ok(out)
}

/// Reads a paper-B scenario file and validates it.
pub fn read_paper_b(path: &std::path::Path) -> Result<Scenario, Failure> {
    match scenario::load_expecting(path, Some(Family::PaperB))? {
        Loaded::PaperB(spec) => Scenario::new(spec).map_err(Failure::input),
        Loaded::PaperA(_) | Loaded::Unified(_) => Err(Failure::Input(
            "model: this command needs a paper-b scenario (\"model\": \"paper-b\")".into(),
        )),
    }
}

/// Runs `multispin correct`.
pub fn run(args: &CorrectArgs) -> Result<(), Failure> {
    let scheme = args.scheme.mode_scheme();
    let sc = read_paper_b(&args.scenario)?;
    let rejected = parse_rejected(&args.rejected, sc.device_count())?;
    let gains: Vec<f64> = rejected.iter().map(|&k| sc.devices[k].channel_gain).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed.unwrap_or(sc.seed));
    let c = reactive::solve(&sc.link(), &gains, scheme, &mut rng).map_err(Failure::input)?;
    let out = Output {
        scheme: scheme.name(),
        rejected,
        modes: c.modes,
        dl_power_w: c.dl_power_w,
        comm_delay_s: c.comm_delay_s,
        ul_delay_s: c.ul_delay_s,
        dl_delay_s: c.dl_delay_s,
    };
    match args.format {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(anyhow::Error::from)?
        ),
        OutputFormat::Table => print!("{}", to_table(&out, &gains)),
    }
    Ok(())
}

fn to_table(out: &Output, gains: &[f64]) -> String {
    let mut t = format!(
        "scheme: {}\ncommunication delay: {:.3} ms (UL {:.3} ms, DL {:.3} ms)\n\n{:>6} {:>14} {:>5} {:>13}\n",
        out.scheme,
        out.comm_delay_s * 1e3,
        out.ul_delay_s * 1e3,
        out.dl_delay_s * 1e3,
        "device",
        "gain (dB)",
        "mode",
        "DL power (mW)"
    );
    for (((k, mode), p), g) in out
        .rejected
        .iter()
        .zip(&out.modes)
        .zip(&out.dl_power_w)
        .zip(gains)
    {
        let mode = serde_json::to_value(mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        t.push_str(&format!(
            "{k:>6} {:>14.2} {mode:>5} {:>13.1}\n",
            spin_channel::units::linear_to_db(*g),
            p * 1e3
        ));
    }
    t
}
