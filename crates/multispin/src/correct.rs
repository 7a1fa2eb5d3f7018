//! `multispin correct`: the reactive step of paper B for one verification outcome (modes and DL powers).

use crate::failure::Failure;
use crate::scenario::{self, Model};
use clap::Args;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use spin_optimize::paper_b::reactive::{self, Mode, ModeScheme};
use spin_optimize::paper_b::{Scenario, ScenarioSpec};
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
    /// Paper-B scenario file (JSON, SI units: Hz, bits, s, W, W/Hz; `"model": "paper-b"`).
    #[arg(long, value_name = "FILE.json")]
    pub scenario: PathBuf,
    /// Indices of the devices whose drafts were rejected, comma separated (0-based, distinct), e.g. `0,3,5`.
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub rejected: String,
    /// Mode selection: optimal (prefix structure + bisection), all-ul, all-dl, random (each ½), brute-force
    /// (all 2^|R| assignments, |R| ≤ 20).
    #[arg(long, default_value = "optimal", value_name = "SCHEME")]
    pub scheme: String,
    /// Seed of the random scheme (default: the scenario's `seed`).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
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

/// Parses `0,3,5` into distinct device indices below `devices`.
fn parse_rejected(text: &str, devices: usize) -> Result<Vec<usize>, Failure> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let k: usize = part.parse().map_err(|_| {
            Failure::Input(format!(
                "rejected: {part:?} is not a device index (0-based integer)"
            ))
        })?;
        if k >= devices {
            return Err(Failure::Input(format!(
                "rejected: device {k} does not exist (the scenario has {devices})"
            )));
        }
        if out.contains(&k) {
            return Err(Failure::Input(format!("rejected: device {k} is listed twice")));
        }
        out.push(k);
    }
    Ok(out)
}

/// Reads a paper-B scenario file and validates it.
pub fn read_paper_b(path: &std::path::Path) -> Result<Scenario, Failure> {
    let (model, value) = scenario::read(path)?;
    if model != Model::PaperB {
        return Err(Failure::Input(
            "model: this command needs a paper-b scenario (\"model\": \"paper-b\")".into(),
        ));
    }
    let spec: ScenarioSpec = scenario::parse(value)?;
    Scenario::new(spec).map_err(Failure::input)
}

/// Runs `multispin correct`.
pub fn run(args: &CorrectArgs) -> Result<(), Failure> {
    let scheme = ModeScheme::parse(&args.scheme).map_err(Failure::input)?;
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
    println!(
        "{}",
        serde_json::to_string_pretty(&out).map_err(anyhow::Error::from)?
    );
    Ok(())
}
