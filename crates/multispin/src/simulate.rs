//! `multispin simulate`: the whole system in one process, a server and K devices over real loopback sockets, with
//! a per-round JSON-lines trace, a summary (JSON and a table), CSV and SVG of goodput over rounds and of the
//! latency split, and `--compare` to run the same seeds and prompts under several schemes. Also holds the options
//! and helpers `serve` and `device` share.

use crate::chart::{Series, svg_bars, svg_lines, svg_scatter_labelled};
use crate::failure::Failure;
use crate::pairing;
use crate::study;
use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use spin_net::baselines::{self, Baseline};
use spin_net::blocking::simulate_blocking;
use spin_net::controller::Scheme;
use spin_net::link::LinkConfig;
use spin_net::proto::{Identity, fingerprint};
use spin_net::server::{Clock, Compute, RoundTrace, ServerConfig, Summary};
use spin_net::sim::SimDevice;
use spin_optimize::paper_b::ModeScheme;
use spin_runtime::{Model, Tokenizer};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The clock of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClockArg {
    /// Simulated time (deterministic with a compute profile).
    Virtual,
    /// Wall time; messages are held for their air time.
    Real,
}

/// Where compute times come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ComputeArg {
    /// The profile given by --draft-token-s, --verify-fixed-s, --verify-per-device-s.
    Profile,
    /// Measured on this machine.
    Measured,
}

/// Options of the server side, shared by `simulate` and `serve`.
#[derive(Debug, Args, Clone)]
pub struct ServerArgs {
    /// Target model: llama2.c `.bin`, GGUF `.gguf`, or a Hugging Face folder (default: the embedded stories260K
    /// checkpoint, models/stories260K.bin).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Tokenizer (llama2.c `.bin` or `tokenizer.json`); GGUF files and HF folders carry their own (default for a
    /// llama2.c model of 512 tokens: the embedded tok512, models/tok512.bin).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Planning scheme: exact, paper-alg1, homo, uni-bw, fixed (paper A), best, greedy, uniform, comp-only (paper B)
    /// or unified (draft lengths, uplink shares and each device's payload jointly; docs/system.md). unified, then
    /// best, are the slowest planners; docs/system.md gives each scheme's server time per round.
    #[arg(long, default_value = "best")]
    pub scheme: String,
    /// Paper B's correction-mode policy: optimal, all-ul, all-dl or random.
    #[arg(long, default_value = "optimal")]
    pub modes: String,
    /// Tokens each device generates (at least 1).
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Stop after this many rounds (at least 1).
    #[arg(long)]
    pub rounds: Option<u64>,
    /// Largest draft length L_max / γ_max.
    #[arg(long, default_value_t = 8)]
    pub max_draft_len: u32,
    /// The draft length of the `fixed` scheme, in [1, --max-draft-len]; only a run of `fixed` takes it. Default:
    /// paper A's L̄ = 8, as in `multispin plan`, lowered to --max-draft-len when that is smaller. `--fixed-len` is
    /// its older spelling, still read.
    #[arg(long, alias = "fixed-len", value_name = "L")]
    pub fixed_draft_len: Option<u32>,
    /// Sampling temperature: 0 is greedy decoding, otherwise a finite number ≥ 1e-6 (as in `generate`).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Seed of every random draw (sampling, drop, fading, planners).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// virtual (simulated, reproducible) or real (wall time, messages really delayed).
    #[arg(long, value_enum, default_value_t = ClockArg::Virtual)]
    pub clock: ClockArg,
    /// profile (the times below) or measured (this machine); the real clock always measures.
    #[arg(long, value_enum, default_value_t = ComputeArg::Profile)]
    pub compute: ComputeArg,
    /// Profile: drafting seconds per token T̄ (each device gets T̄·U[1, 1.15]; paper B's Qwen2.5-0.5B: 0.0152).
    #[arg(long, default_value_t = 0.0152)]
    pub draft_token_s: f64,
    /// Profile: T_fix of T_ver(K, L) = T_fix + K·T_lin + T_tok·ΣL_k in seconds (paper B's Qwen2.5-14B: 0.0428).
    #[arg(long, default_value_t = 0.0428)]
    pub verify_fixed_s: f64,
    /// Profile: T_lin in seconds per device (paper B's Qwen2.5-14B: 0.0076).
    #[arg(long, default_value_t = 0.0076)]
    pub verify_per_device_s: f64,
    /// Profile: T_tok in seconds per drafted token in the batch (0, the papers' model, where T_ver does not
    /// depend on the draft lengths; under --compute measured it is fitted from the timed passes).
    #[arg(long, default_value_t = 0.0)]
    pub verify_per_draft_token_s: f64,
    /// Entries kept per distribution on the air (V_eff, capped at V).
    #[arg(long, default_value_t = 1024)]
    pub v_eff: u32,
    /// Bits per quantised value on the air (Q).
    #[arg(long, default_value_t = 16)]
    pub q_bits: u8,
    /// At temperature 0, every device sends (token, probability) pairs and the server corrects every rejection with
    /// the target's token: no distribution on the air, which greedy verification does not need (without it, the
    /// papers' payloads: paper A's distribution with every drafted token, paper B's exchange after a rejection;
    /// docs/system.md, "Greedy payload").
    #[arg(long)]
    pub greedy_payload: bool,
    /// Total bandwidth B in Hz (paper B: 10 MHz).
    #[arg(long, default_value_t = 10e6)]
    pub bandwidth_hz: f64,
    /// Device transmit power in dBm (paper B: 15).
    #[arg(long, default_value_t = 15.0)]
    pub ul_power_dbm: f64,
    /// Server downlink budget in dBm (paper B: 30).
    #[arg(long, default_value_t = 30.0)]
    pub dl_power_dbm: f64,
    /// A draft arriving later than this (seconds after the plan, on the run's clock) is dropped for the round.
    #[arg(long, default_value_t = 10.0)]
    pub round_deadline: f64,
    /// Wall-clock seconds a device may take to answer in a round, on either clock; one silent past it is dropped for
    /// the round (`silent` in the trace) so that it cannot stall the others.
    #[arg(long, default_value_t = 30.0)]
    pub wall_deadline_s: f64,
    /// Prior α₀ of the online acceptance estimate.
    #[arg(long, default_value_t = 0.7)]
    pub alpha_prior: f64,
    /// How much a round's acceptance evidence counts one round later in the planners' estimate, in (0, 1]: 1 keeps
    /// every round alike, as the papers' controllers do; 0.97 (a half-life of about 23 rounds) lets a device that
    /// stopped drafting be asked again.
    #[arg(long, default_value_t = 0.97)]
    pub alpha_memory: f64,
    /// Outcome samples of paper B's sample-average approximation, per round.
    #[arg(long, default_value_t = 200)]
    pub saa_samples: u32,
    /// Real clock: milliseconds of wall time the server may plan a round while the devices wait. `best`'s
    /// exhaustive step and the unified branch and bound stop there with their best plan so far (their heuristic
    /// searches always finish); `none` lets planning run to the end. The virtual clock does not charge planning
    /// and ignores it.
    #[arg(long, default_value = "2", value_name = "MS|none", allow_hyphen_values = true)]
    pub plan_budget_ms: String,
}

impl ServerArgs {
    /// The draft length of `fixed`: `--fixed-draft-len` (only when `scheme` is `fixed`, inside [1,
    /// --max-draft-len]), else [`FIXED_DRAFT_LEN`](spin_optimize::paper_a::baselines::FIXED_DRAFT_LEN) lowered to
    /// --max-draft-len.
    fn fixed_draft_len(&self, scheme: Scheme) -> Result<u32, Failure> {
        let Some(l) = self.fixed_draft_len else {
            return Ok(spin_optimize::paper_a::baselines::FIXED_DRAFT_LEN.min(self.max_draft_len));
        };
        if scheme != Scheme::Fixed {
            return Err(Failure::Input(format!(
                "--fixed-draft-len: only the fixed scheme takes it (the scheme is {scheme})"
            )));
        }
        if !(1..=self.max_draft_len).contains(&l) {
            return Err(Failure::Input(format!(
                "--fixed-draft-len: {l} is outside [1, --max-draft-len] = [1, {}]",
                self.max_draft_len
            )));
        }
        Ok(l)
    }

    /// The server configuration (the target's identity filled in by the caller).
    pub fn config(&self, identity: Identity) -> Result<ServerConfig, Failure> {
        let scheme = Scheme::parse_per_round(&self.scheme).map_err(Failure::input)?;
        let mut cfg = ServerConfig::new(scheme, identity);
        cfg.modes = match self.modes.as_str() {
            "brute-force" => {
                return Err(Failure::Input(
                    "modes: brute-force is a test reference; use optimal".into(),
                ));
            }
            m => ModeScheme::parse(m)
                .map_err(|e| Failure::Input(e.to_string().replacen("scheme", "modes", 1)))?,
        };
        cfg.temperature = crate::temperature::check(self.temperature)?;
        if self.max_tokens == 0 {
            return Err(Failure::Input("--max-tokens: must be at least 1".into()));
        }
        if self.rounds == Some(0) {
            return Err(Failure::Input("--rounds: must be at least 1".into()));
        }
        cfg.max_new_tokens = self.max_tokens;
        cfg.max_rounds = self.rounds;
        cfg.max_draft_len = self.max_draft_len;
        cfg.seed = self.seed;
        cfg.v_eff = self.v_eff;
        cfg.q_bits = self.q_bits;
        cfg.greedy_payload = self.greedy_payload;
        cfg.round_deadline_s = self.round_deadline;
        cfg.wall_deadline = seconds("wall_deadline_s", self.wall_deadline_s)?;
        cfg.alpha_prior = self.alpha_prior;
        cfg.alpha_memory = self.alpha_memory;
        cfg.saa_samples = self.saa_samples;
        cfg.plan_budget = plan_budget(&self.plan_budget_ms)?;
        cfg.clock = match self.clock {
            ClockArg::Virtual => Clock::Virtual,
            ClockArg::Real => Clock::Real,
        };
        cfg.compute = match (self.compute, self.clock) {
            (ComputeArg::Measured, _) | (_, ClockArg::Real) => Compute::Measured,
            (ComputeArg::Profile, ClockArg::Virtual) => Compute::Profile {
                draft_token_s: self.draft_token_s,
                draft_spread: 0.15,
                verify_fixed_s: self.verify_fixed_s,
                verify_per_device_s: self.verify_per_device_s,
                verify_per_draft_token_s: self.verify_per_draft_token_s,
            },
        };
        let dbm = spin_channel::units::dbm_to_w;
        let mut link = LinkConfig::paper_b();
        link.bandwidth_hz = self.bandwidth_hz;
        link.ul_power_w = dbm(self.ul_power_dbm);
        link.dl_power_w = dbm(self.dl_power_dbm);
        cfg.link = link;
        cfg.validate().map_err(Failure::input)?;
        cfg.fixed_draft_len = self.fixed_draft_len(scheme)?;
        Ok(cfg)
    }
}

/// Arguments of `multispin simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
    #[command(flatten)]
    pub server: ServerArgs,
    /// Draft model (same vocabulary as the target; default: the embedded 2-layer, width-32 draft distilled from
    /// stories260K, models/draft-2x32.bin).
    #[arg(long, conflicts_with = "self_draft_layers")]
    pub draft: Option<PathBuf>,
    /// How the draft model's dense matrices are held, as `generate --draft-format` says: `auto`, `as-stored`,
    /// or `q8_0` / `q4_0` / `q4_1` (quantised at load onto the quantised host route).
    #[arg(long, value_enum, default_value_t = crate::draft_format::DraftFormat::Auto)]
    pub draft_format: crate::draft_format::DraftFormat,
    /// Every device's drafting, and Cen-SPIN's at the server (`--compare cen-spin`), with prompt lookup.
    #[command(flatten)]
    pub lookup: crate::lookup::LookupArgs,
    /// Draft with the target's first N layers and its own head (self-speculation) instead of a draft model.
    #[arg(long)]
    pub self_draft_layers: Option<usize>,
    /// Number of devices K.
    #[arg(long, default_value_t = 8)]
    pub devices: usize,
    /// Prompts, one per line (at most 1 MiB, no blank line); device k gets line k mod (number of lines). Default: a
    /// built-in story list.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Also run these schemes (comma-separated) on the same seeds and prompts and print one table; the `--scheme`
    /// (default best) always runs first and is the one whose per-device table is printed. Besides the planners'
    /// schemes, paper A's baselines: cen-spin (the server drafts for every device and verifies), p2p-spin (one
    /// device at a time with the whole band) and plain (batched decoding at the server, no drafting); with any of
    /// them, fig6.csv and fig6.svg set every scheme's goodput beside Multi-SPIN's (docs/system.md).
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    /// Run everything once per device count of this list (comma-separated, e.g. 1,2,4,8; it replaces --devices),
    /// each into the folder K1, K2, … under --out, and join the Fig. 6 rows of every K in fig6.csv and
    /// fig6-sweep.svg there.
    #[arg(long, value_delimiter = ',')]
    pub sweep_devices: Vec<usize>,
    /// Output folder for the trace, summary, CSV and SVG.
    #[arg(long, default_value = "target/simulate")]
    pub out: PathBuf,
}

const DEFAULT_PROMPTS: [&str; 8] = [
    "Once upon a time",
    "The little dog",
    "Lily and Ben went to the park",
    "One day, a big bird",
    "Tom had a red ball",
    "The sun was shining",
    "Sara found a box",
    "There was a happy cat",
];

/// The embedded model (models/, compiled into the binary) a missing model flag stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedded {
    /// stories260K (models/stories260K.bin).
    Target,
    /// The distilled 2-layer, width-32 draft (models/draft-2x32.bin).
    Draft,
}

/// Loads the model at `path`, or the embedded `fallback` when no path is given, mapping failures to input errors
/// naming the file. A target must be able to verify: a restricted-head draft is refused (`pairing::check_target`).
pub fn load(path: Option<&Path>, fallback: Embedded) -> Result<Model, Failure> {
    let device = spin_runtime::select_device().map_err(|e| Failure::Runtime(e.into()))?;
    let model = match (path, fallback) {
        (Some(p), _) => spin_runtime::load_model(p, &device),
        (None, Embedded::Target) => spin_runtime::embedded::target(&device),
        (None, Embedded::Draft) => spin_runtime::embedded::draft(&device),
    }
    .map_err(Failure::input)?;
    if fallback == Embedded::Target {
        pairing::check_target(&model, path)?;
    }
    Ok(model)
}

/// Loads the tokenizer of the model at `model` (`None`: an embedded model) with `vocab` tokens: `tokenizer` when
/// given, else the one a GGUF file or Hugging Face folder carries, else the embedded tok512 when the vocabulary has
/// its 512 tokens (otherwise an input error asking for `--tokenizer`).
pub fn load_tokenizer(
    tokenizer: Option<&Path>,
    model: Option<&Path>,
    vocab: usize,
) -> Result<Tokenizer, Failure> {
    if tokenizer.is_none() && !carries_own_tokenizer(model) && vocab == 512 {
        return spin_runtime::embedded::tokenizer()
            .map(Tokenizer::Llama2c)
            .map_err(Failure::input);
    }
    spin_runtime::load_tokenizer(tokenizer, model.unwrap_or(Path::new("embedded model")), vocab)
        .map_err(Failure::input)
}

/// The tokenizer `model` (loaded from `path` by `flag`; `None`: embedded) is paired with: `tokenizer` when given,
/// else the one the model carries ([`load_tokenizer`]), checked against the vocabulary the model speaks
/// (`Model::output_vocab`, a restricted draft head's target's) by [`pairing::check_tokenizer`].
pub fn tokenizer_for(
    tokenizer: Option<&Path>,
    model: &Model,
    flag: &str,
    path: Option<&Path>,
) -> Result<Tokenizer, Failure> {
    let tok = load_tokenizer(tokenizer, path, model.output_vocab())?;
    pairing::check_tokenizer(&tok, tokenizer, model, flag, path)?;
    Ok(tok)
}

/// Whether the model at `model` carries its own tokenizer (a GGUF file or a model folder), which
/// [`load_tokenizer`] then reads without needing the model's vocabulary.
pub fn carries_own_tokenizer(model: Option<&Path>) -> bool {
    model.is_some_and(|m| m.is_dir() || m.extension().is_some_and(|e| e == "gguf"))
}

/// The identity of a model and tokenizer: the vocabulary the model speaks (a restricted-head draft's is the
/// target's, `Model::output_vocab`), a fingerprint of every token's text, and one of the model's configuration.
pub fn identity(model: &Model, tok: &Tokenizer) -> Identity {
    let vocab = model.output_vocab();
    Identity {
        vocab: vocab as u32,
        tokenizer: tokenizer_fingerprint(tok, vocab),
        model: fingerprint(format!("{:?}", model.config()).as_bytes()),
    }
}

/// `Identity.tokenizer` (docs/protocol.md §"The tokenizer fingerprint", byte by byte): FNV-1a 64 over, for every id
/// from 0 to `vocab` − 1, the UTF-8 text of decoding that id alone (special tokens skipped) and one zero byte.
pub fn tokenizer_fingerprint(tok: &Tokenizer, vocab: usize) -> u64 {
    let mut text = Vec::new();
    for id in 0..vocab as u32 {
        text.extend_from_slice(tok.decode(&[id]).unwrap_or_default().as_bytes());
        text.push(0);
    }
    fingerprint(&text)
}

/// Encodes a prompt (BOS prepended as the model's file says, `Tokenizer::add_bos`; an empty prompt becomes token 0
/// or BOS).
pub fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, Failure> {
    let mut p = tok.encode_prompt(text).map_err(Failure::input)?;
    if p.is_empty() {
        p = vec![tok.bos().unwrap_or(0)];
    }
    Ok(p)
}

/// Runs `multispin simulate`.
pub fn run(args: &SimulateArgs) -> Result<(), Failure> {
    // SAFETY: called only by `main`, after argument parsing and before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        args.threads.set_up()?;
    }
    if args.sweep_devices.is_empty() {
        run_at(args)?;
        eprintln!("wrote {}", args.out.display());
        return Ok(());
    }
    if args.sweep_devices.contains(&0) {
        return Err(Failure::Input(
            "sweep_devices: every device count must be at least 1".into(),
        ));
    }
    if let Some(&k) = args.sweep_devices.iter().find(|&&k| k > MAX_SIM_DEVICES) {
        return Err(Failure::Input(format!(
            "sweep_devices: {k} exceeds {MAX_SIM_DEVICES} devices (a server's default max_devices)"
        )));
    }
    let mut rows: Vec<(usize, Vec<Run>)> = Vec::new();
    for &k in &args.sweep_devices {
        let mut at = args.clone();
        at.devices = k;
        at.out = args.out.join(format!("K{k}"));
        eprintln!("== K = {k} into {}", at.out.display());
        rows.push((k, run_at(&at)?));
    }
    let mut csv = String::new();
    for (i, (k, results)) in rows.iter().enumerate() {
        let part = fig6_csv(*k, results);
        let skip = if i == 0 { 0 } else { 1 };
        for line in part.lines().skip(skip) {
            csv.push_str(line);
            csv.push('\n');
        }
    }
    write(&args.out.join("fig6.csv"), &csv)?;
    // One measured line (and one predicted, where there is a prediction) per scheme over K.
    let mut names: Vec<&'static str> = Vec::new();
    for (_, results) in &rows {
        for (s, _) in results {
            if !names.contains(&s.scheme) {
                names.push(s.scheme);
            }
        }
    }
    let mut lines: Vec<(String, Points, bool)> = Vec::new();
    for name in names {
        let at = |f: fn(&Summary) -> f64| -> Vec<(f64, f64)> {
            rows.iter()
                .filter_map(|(k, r)| {
                    r.iter()
                        .find(|(s, _)| s.scheme == name)
                        .map(|(s, _)| (*k as f64, f(s)))
                })
                .filter(|p| p.1.is_finite())
                .collect()
        };
        lines.push((format!("{name} measured"), at(|s| s.goodput), true));
        let predicted = at(|s| s.predicted_goodput);
        if !predicted.is_empty() {
            lines.push((format!("{name} predicted"), predicted, false));
        }
    }
    let series: Vec<Series<'_>> = lines
        .iter()
        .map(|(n, p, m)| (n.as_str(), p.as_slice(), *m))
        .collect();
    svg_lines(
        &args.out.join("fig6-sweep.svg"),
        "Goodput against the number of devices (measured, with markers, and predicted)",
        "devices K",
        "goodput (tokens / s)",
        &series,
    )?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

/// One scheme's run: its totals and its rounds.
type Run = (Summary, Vec<RoundTrace>);

/// Points of a chart series.
type Points = Vec<(f64, f64)>;

/// The most devices one simulation runs, checked before anything starts: a server's default `max_devices`
/// (100,000 devices ran past a minute and 1.2 GB before failing a planning limit).
const MAX_SIM_DEVICES: usize = spin_net::server::DEFAULT_MAX_DEVICES;

/// One run at `args.devices` devices into `args.out`: every scheme, then the baselines; returns what each gave.
fn run_at(args: &SimulateArgs) -> Result<Vec<Run>, Failure> {
    if args.devices == 0 {
        return Err(Failure::Input("devices: must be at least 1".into()));
    }
    if args.devices > MAX_SIM_DEVICES {
        return Err(Failure::Input(format!(
            "devices: {} exceeds {MAX_SIM_DEVICES} (a server's default max_devices)",
            args.devices
        )));
    }
    let (target, drafter, tok) = load_models(args)?;
    let devices = sim_devices(args, &tok, target.config().max_seq_len)?;
    let id = identity(&target, &tok);
    let (configs, extra) = scheme_configs(args, id)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let target = Arc::new(target);
    let drafter = Arc::new(drafter);
    let mut results: Vec<(Summary, Vec<RoundTrace>)> = Vec::new();
    for cfg in configs {
        let name = cfg.scheme.name();
        let trace = args.out.join(format!("trace-{name}.jsonl"));
        let (outcome, rounds) = simulate_scheme(args, &target, &drafter, id, cfg, &devices, Some(&trace))?;
        let summary = write_scheme(
            args,
            name,
            outcome.summary,
            &rounds,
            &devices,
            &tok,
            results.is_empty(),
        )?;
        let stopped = summary.stopped.clone();
        results.push((summary, rounds));
        if stopped == "shutdown" {
            eprintln!("interrupted: traces flushed to {}", args.out.display());
            break;
        }
    }
    let planned = results.len();
    if results.last().is_none_or(|(s, _)| s.stopped != "shutdown") {
        for b in &extra {
            let (summary, rounds) = run_baseline(args, &target, &drafter, id, *b, &devices)?;
            let summary = write_scheme(args, b.name(), summary, &rounds, &devices, &tok, false)?;
            let stopped = summary.stopped == "shutdown";
            results.push((summary, rounds));
            if stopped {
                eprintln!("interrupted: traces flushed to {}", args.out.display());
                break;
            }
        }
    }
    write_prediction_check(args, &results, planned)?;
    write_plots(args, &results)?;
    if !extra.is_empty() {
        write_fig6(args, &results)?;
    }
    Ok(results)
}

/// The target, the drafter (with the same vocabulary) and the tokenizer.
fn load_models(args: &SimulateArgs) -> Result<(Model, Model, Tokenizer), Failure> {
    let target = load(args.server.target.as_deref(), Embedded::Target)?;
    let drafter = match args.self_draft_layers {
        Some(n) => target.first_layers(n).map_err(|e| {
            Failure::Input(format!(
                "self_draft_layers: {}",
                e.to_string().trim_start_matches("self_draft_layers: ")
            ))
        })?,
        None => {
            let d = load(args.draft.as_deref(), Embedded::Draft)?;
            match args.draft_format.for_draft(&d) {
                None => d,
                Some(f) => d.quantize_host(f).map_err(|e| {
                    Failure::Input(format!("draft_format: {}", e.to_string().replace('\n', " ")))
                })?,
            }
        }
    };
    pairing::check_draft(&drafter, &target, "--draft")?;
    let tok = tokenizer_for(
        args.server.tokenizer.as_deref(),
        &target,
        "--target",
        args.server.target.as_deref(),
    )?;
    Ok((target, drafter, tok))
}

/// One simulated device per `--devices`, each prompted with a line of the prompts (cycled). A prompt that leaves
/// no room for `--max-tokens` in the target's `context` is refused here, naming its line, before any device starts.
fn sim_devices(args: &SimulateArgs, tok: &Tokenizer, context: usize) -> Result<Vec<SimDevice>, Failure> {
    let lines: Vec<String> = match &args.prompts {
        None => DEFAULT_PROMPTS.iter().map(|s| s.to_string()).collect(),
        Some(p) => crate::prompt_file::read(p)?,
    };
    let max_tokens = args.server.max_tokens;
    if max_tokens >= context {
        return Err(Failure::Input(format!(
            "--max-tokens: {max_tokens} leaves no room for a prompt in the target's context of {context} tokens"
        )));
    }
    let used = lines.len().min(args.devices);
    let prompts: Vec<Vec<u32>> = lines[..used]
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let p = encode(tok, line)?;
            if p.len() + max_tokens > context {
                let what = match &args.prompts {
                    Some(f) => crate::prompt_file::line_label(f, i),
                    None => format!("built-in prompt {}", i + 1),
                };
                return Err(Failure::Input(format!(
                    "{what}: {} tokens plus --max-tokens {max_tokens} exceed the target's context of {context} tokens",
                    p.len()
                )));
            }
            Ok(p)
        })
        .collect::<Result<_, Failure>>()?;
    let lookup = args.lookup.lookup()?;
    Ok((0..args.devices)
        .map(|k| SimDevice {
            prompt: prompts[k % used].clone(),
            lookup,
            ..Default::default()
        })
        .collect())
}

/// One server configuration per scheme to run: `--scheme` first, then each `--compare` scheme once; and the
/// baselines of `--compare`, run after them in the order given. A name that is neither is an input error naming
/// `compare`.
fn scheme_configs(args: &SimulateArgs, id: Identity) -> Result<(Vec<ServerConfig>, Vec<Baseline>), Failure> {
    if Baseline::parse(&args.server.scheme).is_some() {
        return Err(Failure::Input(format!(
            "scheme: {} is a baseline, not a planner; pass it to --compare beside the planner's scheme",
            args.server.scheme
        )));
    }
    let mut schemes = vec![args.server.scheme.clone()];
    let mut extra: Vec<Baseline> = Vec::new();
    for s in &args.compare {
        if let Some(b) = Baseline::parse(s) {
            if !extra.contains(&b) {
                extra.push(b);
            }
            continue;
        }
        if let Err(e) = Scheme::parse_per_round(s) {
            let names: Vec<&str> = Baseline::ALL.iter().map(|b| b.name()).collect();
            return Err(Failure::Input(format!(
                "compare: {}; or a baseline: {}",
                e.to_string().trim_start_matches("scheme: "),
                names.join(", ")
            )));
        }
        if !schemes.contains(s) {
            schemes.push(s.clone());
        }
    }
    if !args.compare.is_empty() && !args.compare.contains(&args.server.scheme) {
        eprintln!(
            "note: --compare also runs --scheme {} (first; its per-device table is printed)",
            args.server.scheme
        );
    }
    if args.server.fixed_draft_len.is_some() && !schemes.iter().any(|s| s == Scheme::Fixed.name()) {
        return Err(Failure::Input(format!(
            "--fixed-draft-len: only the fixed scheme takes it (--scheme or --compare; this run plans {})",
            schemes.join(", ")
        )));
    }
    let configs: Vec<ServerConfig> = schemes
        .iter()
        .map(|s| server_for(&args.server, s).config(id))
        .collect::<Result<_, _>>()?;
    Ok((configs, extra))
}

/// The server options of a run of `scheme`: `--fixed-draft-len` kept for `fixed` only (a `--compare` run of another
/// scheme beside it has no fixed length).
fn server_for(server: &ServerArgs, scheme: &str) -> ServerArgs {
    let mut a = server.clone();
    a.scheme = scheme.to_string();
    if scheme != Scheme::Fixed.name() {
        a.fixed_draft_len = None;
    }
    a
}

/// One scheme's simulation, its rounds traced to `trace-<scheme>.jsonl` as they end, with a progress bar.
fn simulate_scheme(
    args: &SimulateArgs,
    target: &Arc<Model>,
    drafter: &Arc<Model>,
    id: Identity,
    cfg: ServerConfig,
    devices: &[SimDevice],
    trace_path: Option<&Path>,
) -> Result<(spin_net::sim::SimOutcome, Vec<RoundTrace>), Failure> {
    let name = cfg.scheme.name();
    let (mut trace, trace_path) = open_trace(trace_path)?;
    let total = (devices.len() * args.server.max_tokens) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} tokens ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(name);
    let mut rounds = Vec::new();
    let mut write_err: Option<std::io::Error> = None;
    let outcome = simulate_blocking(target.clone(), drafter.clone(), id, cfg, devices, |t| {
        trace_round(&mut trace, t, &mut write_err);
        bar.inc(t.tokens);
        rounds.push(t.clone());
    });
    bar.finish_and_clear();
    if let Some(e) = write_err {
        return Err(Failure::Runtime(anyhow::anyhow!("writing {trace_path}: {e}")));
    }
    let outcome = outcome.map_err(Failure::input)?;
    for (k, d) in outcome.devices.iter().enumerate() {
        if let Err(e) = d {
            eprintln!("device {k}: {e}");
        }
    }
    Ok((outcome, rounds))
}

/// A trace file (JSON lines) at `path`, or a sink when there is none; and its name for messages.
fn open_trace(path: Option<&Path>) -> Result<(Box<dyn Write>, String), Failure> {
    Ok(match path {
        Some(p) => (
            Box::new(std::io::BufWriter::new(
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            )),
            p.display().to_string(),
        ),
        None => (Box::new(std::io::sink()), String::new()),
    })
}

/// Writes one round's trace line and flushes it (so an interrupted run leaves a complete trace); the first write
/// error is kept in `err`.
fn trace_round(trace: &mut dyn Write, t: &RoundTrace, err: &mut Option<std::io::Error>) {
    let line = serde_json::to_string(t).unwrap_or_default();
    if let Err(e) = writeln!(trace, "{line}").and_then(|_| trace.flush()) {
        err.get_or_insert(e);
    }
}

/// One baseline of paper A on the same target, draft, prompts, seeds and drop as the planners' runs (its trace to
/// `trace-<baseline>.jsonl`). Cen-SPIN and plain decoding run at the server in this process; P2P-SPIN runs the
/// networked system once per device alone (at its own drop distance, with the whole band, planned by `--scheme`)
/// and joins the turns.
fn run_baseline(
    args: &SimulateArgs,
    target: &Arc<Model>,
    drafter: &Arc<Model>,
    id: Identity,
    baseline: Baseline,
    devices: &[SimDevice],
) -> Result<(Summary, Vec<RoundTrace>), Failure> {
    let cfg = server_for(&args.server, &args.server.scheme).config(id)?;
    let trace_path = args.out.join(format!("trace-{}.jsonl", baseline.name()));
    let prompts: Vec<Vec<u32>> = devices.iter().map(|d| d.prompt.clone()).collect();
    let started = std::time::Instant::now();
    eprintln!("{}: running", baseline.name());
    let (summary, rounds) = match baseline {
        Baseline::CenSpin | Baseline::Plain => {
            let (mut trace, name) = open_trace(Some(&trace_path))?;
            let mut write_err = None;
            let mut rounds = Vec::new();
            let on_round = |t: &RoundTrace| {
                trace_round(&mut trace, t, &mut write_err);
                rounds.push(t.clone());
            };
            let lookup = args.lookup.lookup()?;
            let summary = spin_net::blocking::with_ctrl_c(|stop| {
                if baseline == Baseline::CenSpin {
                    baselines::cen_spin(
                        target.clone(),
                        drafter.clone(),
                        lookup,
                        &cfg,
                        &prompts,
                        stop,
                        on_round,
                    )
                } else {
                    baselines::plain(target.clone(), &cfg, &prompts, stop, on_round)
                }
            })
            .map_err(Failure::input)?;
            if let Some(e) = write_err {
                return Err(Failure::Runtime(anyhow::anyhow!("writing {name}: {e}")));
            }
            (summary, rounds)
        }
        Baseline::P2pSpin => {
            let mut turns = Vec::with_capacity(devices.len());
            for (k, d) in devices.iter().enumerate() {
                let alone = SimDevice {
                    prompt: d.prompt.clone(),
                    lookup: d.lookup,
                    distance_m: Some(
                        d.distance_m
                            .unwrap_or_else(|| cfg.link.drop_distance(cfg.seed, k)),
                    ),
                    ..Default::default()
                };
                let (outcome, rounds) =
                    simulate_scheme(args, target, drafter, id, cfg.clone(), &[alone], None)?;
                turns.push((outcome.summary, rounds));
            }
            let (summary, rounds) = baselines::p2p_spin(turns);
            let (mut trace, name) = open_trace(Some(&trace_path))?;
            let mut write_err = None;
            for t in &rounds {
                trace_round(&mut trace, t, &mut write_err);
            }
            if let Some(e) = write_err {
                return Err(Failure::Runtime(anyhow::anyhow!("writing {name}: {e}")));
            }
            (summary, rounds)
        }
    };
    eprintln!(
        "{}: {} tokens in {} rounds ({:.1} s of wall time)",
        baseline.name(),
        summary.tokens,
        summary.rounds,
        started.elapsed().as_secs_f64()
    );
    Ok((summary, rounds))
}

/// One scheme's `summary-<scheme>.json` (with every device's text) and `rounds-<scheme>.csv`; the first
/// scheme's per-device table is printed.
fn write_scheme(
    args: &SimulateArgs,
    name: &str,
    summary: Summary,
    rounds: &[RoundTrace],
    devices: &[SimDevice],
    tok: &Tokenizer,
    first: bool,
) -> Result<Summary, Failure> {
    let mut json = serde_json::to_value(&summary).context("summary to JSON")?;
    let texts: Vec<String> = summary
        .devices
        .iter()
        .zip(devices)
        .map(|(d, sd)| {
            let mut all = sd.prompt.clone();
            all.extend_from_slice(&d.generated);
            tok.decode(&all).unwrap_or_default()
        })
        .collect();
    json["texts"] = serde_json::to_value(&texts).context("texts to JSON")?;
    write(
        &args.out.join(format!("summary-{name}.json")),
        &serde_json::to_string_pretty(&json).context("summary to JSON")?,
    )?;
    write(&args.out.join(format!("rounds-{name}.csv")), &rounds_csv(rounds))?;
    if first {
        println!("{}", device_table(&summary, &texts));
    }
    Ok(summary)
}

/// The comparison of every scheme run: the scheme table, `summary.csv`, and each planner's predicted against
/// measured goodput (`prediction.csv`, `prediction.svg`) for the first `planned` results (the baselines after them
/// have no per-round plan whose acceptance assumption the check could test).
fn write_prediction_check(
    args: &SimulateArgs,
    results: &[(Summary, Vec<RoundTrace>)],
    planned: usize,
) -> Result<(), Failure> {
    println!("{}", scheme_table(results));
    let models = verify_model_table(results);
    if !models.is_empty() {
        println!("\nT_ver(K, L) = T_fix + K·T_lin + T_tok·ΣL each planner ended with (ms)\n{models}");
    }
    write(&args.out.join("summary.csv"), &summary_csv(results))?;
    let checks: Vec<_> = results[..planned]
        .iter()
        .map(|(s, r)| study::check(s, r))
        .collect();
    println!("\nprediction check\n{}", study::table(&checks));
    write(&args.out.join("prediction.csv"), &study::csv(&checks))?;
    // Schemes that planned alike land on one point: one label for them, not names printed over each other.
    let mut points: Vec<(String, f64, f64)> = Vec::new();
    for c in &checks {
        match points
            .iter_mut()
            .find(|p| p.1 == c.measured && p.2 == c.predicted)
        {
            Some(p) => p.0 = format!("{} = {}", p.0, c.scheme),
            None => points.push((c.scheme.clone(), c.measured, c.predicted)),
        }
    }
    svg_scatter_labelled(
        &args.out.join("prediction.svg"),
        "Predicted against measured goodput",
        "measured goodput (tokens / s)",
        "predicted goodput (tokens / s)",
        &points,
    )?;
    Ok(())
}

/// Cumulative goodput over rounds for every scheme (`goodput.svg`) and the first scheme's latency split per round
/// (`latency.svg`).
fn write_plots(args: &SimulateArgs, results: &[(Summary, Vec<RoundTrace>)]) -> Result<(), Failure> {
    let goodput: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|(s, r)| {
            let mut tokens = 0u64;
            let pts = r
                .iter()
                .map(|t| {
                    tokens += t.tokens;
                    (
                        (t.round + 1) as f64,
                        if t.clock_s > 0.0 {
                            tokens as f64 / t.clock_s
                        } else {
                            0.0
                        },
                    )
                })
                .collect();
            (s.scheme.to_string(), pts)
        })
        .collect();
    let series: Vec<Series<'_>> = goodput
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_slice(), false))
        .collect();
    svg_lines(
        &args.out.join("goodput.svg"),
        "Cumulative goodput over rounds",
        "round",
        "tokens / s",
        &series,
    )?;
    let (_, first) = &results[0];
    let split: Vec<(&str, Vec<(f64, f64)>)> = vec![
        (
            "draft + uplink",
            first
                .iter()
                .map(|t| ((t.round + 1) as f64, t.draft_up_s))
                .collect(),
        ),
        (
            "verification",
            first.iter().map(|t| ((t.round + 1) as f64, t.verify_s)).collect(),
        ),
        (
            "correction",
            first
                .iter()
                .map(|t| ((t.round + 1) as f64, t.correction_s))
                .collect(),
        ),
    ];
    let series: Vec<Series<'_>> = split.iter().map(|(n, p)| (*n, p.as_slice(), false)).collect();
    svg_lines(
        &args.out.join("latency.svg"),
        &format!("Latency split per round ({})", results[0].0.scheme),
        "round",
        "seconds",
        &series,
    )?;
    Ok(())
}

/// Paper A's Fig. 6 from this run: every scheme's measured goodput beside its prediction (where a planner made
/// one) and its ratio to the first scheme's (the Multi-SPIN `--scheme`), printed and written as `fig6.csv` and
/// `fig6.svg`.
fn write_fig6(args: &SimulateArgs, results: &[(Summary, Vec<RoundTrace>)]) -> Result<(), Failure> {
    let table = fig6_table(results);
    println!("\nFig. 6 (K = {})\n{table}", args.devices);
    write(&args.out.join("fig6.csv"), &fig6_csv(args.devices, results))?;
    let groups: Vec<(String, Vec<f64>)> = results
        .iter()
        .map(|(s, _)| (s.scheme.to_string(), vec![s.goodput, s.predicted_goodput]))
        .collect();
    svg_bars(
        &args.out.join("fig6.svg"),
        &format!(
            "Goodput of each scheme, K = {} (measured beside predicted)",
            args.devices
        ),
        "goodput (tokens / s)",
        &["measured", "predicted"],
        &groups,
    )
}

/// Multi-SPIN's goodput over each scheme's: how many times faster the first scheme is (paper A's Fig. 6 ratios).
fn ratio(first: f64, other: f64) -> f64 {
    if other > 0.0 { first / other } else { f64::NAN }
}

/// What a run's rounds drafted: the mean draft length per device and round, and the share of drafted tokens
/// accepted (NaN when nothing was drafted).
fn drafting(rounds: &[RoundTrace]) -> (f64, f64) {
    let (mut n, mut drafted, mut accepted) = (0u64, 0u64, 0u64);
    for d in rounds.iter().flat_map(|r| &r.devices) {
        n += 1;
        drafted += u64::from(d.draft_len);
        accepted += u64::from(d.accepted.min(d.draft_len));
    }
    let mean = if n > 0 {
        drafted as f64 / n as f64
    } else {
        f64::NAN
    };
    let share = if drafted > 0 {
        accepted as f64 / drafted as f64
    } else {
        f64::NAN
    };
    (mean, share)
}

/// One line per scheme: measured and predicted goodput, Multi-SPIN's (the first scheme's) over it, the mean draft
/// length and the share of drafted tokens accepted.
pub fn fig6_table(results: &[(Summary, Vec<RoundTrace>)]) -> String {
    let first = results.first().map_or(f64::NAN, |(s, _)| s.goodput);
    let mut s = format!(
        "{:<11} {:>10} {:>10} {:>12} {:>7} {:>9}\n",
        "scheme", "goodput", "predicted", "first/this", "mean L", "accepted"
    );
    let or_na = |v: f64, digits: usize| {
        if v.is_finite() {
            format!("{v:.digits$}")
        } else {
            "n/a".into()
        }
    };
    for (r, rounds) in results {
        let (mean, share) = drafting(rounds);
        s.push_str(&format!(
            "{:<11} {:>10.1} {:>10} {:>12.2} {:>7} {:>9}\n",
            r.scheme,
            r.goodput,
            or_na(r.predicted_goodput, 1),
            ratio(first, r.goodput),
            or_na(mean, 2),
            or_na(share, 3)
        ));
    }
    s.trim_end().to_owned()
}

fn fig6_csv(devices: usize, results: &[(Summary, Vec<RoundTrace>)]) -> String {
    let first = results.first().map_or(f64::NAN, |(s, _)| s.goodput);
    let mut s = String::from(
        "devices,scheme,goodput,predicted_goodput,first_over_this,mean_draft_len,accepted_share,verify_s,draft_s\n",
    );
    for (r, rounds) in results {
        let (mean, share) = drafting(rounds);
        s.push_str(&format!(
            "{devices},{},{},{},{},{},{},{},{}\n",
            r.scheme,
            r.goodput,
            r.predicted_goodput,
            ratio(first, r.goodput),
            mean,
            share,
            r.verify_s,
            r.draft_s
        ));
    }
    s
}

fn write(path: &Path, text: &str) -> Result<(), Failure> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Per-round CSV: round, clock, latency split, tokens, round goodput, predicted goodput.
pub fn rounds_csv(rounds: &[RoundTrace]) -> String {
    let mut s = String::from(
        "round,clock_s,latency_s,draft_up_s,draft_s,verify_s,correction_s,tokens,goodput,predicted_goodput\n",
    );
    for t in rounds {
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{}\n",
            t.round,
            t.clock_s,
            t.latency_s,
            t.draft_up_s,
            t.draft_s,
            t.verify_s,
            t.correction_s,
            t.tokens,
            if t.latency_s > 0.0 {
                t.tokens as f64 / t.latency_s
            } else {
                0.0
            },
            t.predicted_goodput
        ));
    }
    s
}

fn summary_csv(results: &[(Summary, Vec<RoundTrace>)]) -> String {
    let mut s = String::from(
        "scheme,rounds,tokens,elapsed_s,goodput,predicted_goodput,draft_up_s,draft_s,verify_s,correction_s\n",
    );
    for (r, _) in results {
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{}\n",
            r.scheme,
            r.rounds,
            r.tokens,
            r.elapsed_s,
            r.goodput,
            r.predicted_goodput,
            r.draft_up_s,
            r.draft_s,
            r.verify_s,
            r.correction_s
        ));
    }
    s
}

/// One line per scheme: measured goodput beside the planner's prediction and the latency split.
pub fn scheme_table(results: &[(Summary, Vec<RoundTrace>)]) -> String {
    let mut s = format!(
        "{:<11} {:>6} {:>7} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
        "scheme", "rounds", "tokens", "time s", "goodput", "predicted", "draft+up", "verify", "correct"
    );
    for (r, _) in results {
        s.push_str(&format!(
            "{:<11} {:>6} {:>7} {:>9.3} {:>10.1} {:>10.1} {:>9.3} {:>9.3} {:>9.3}\n",
            r.scheme,
            r.rounds,
            r.tokens,
            r.elapsed_s,
            r.goodput,
            r.predicted_goodput,
            r.draft_up_s,
            r.verify_s,
            r.correction_s
        ));
    }
    s.trim_end().to_owned()
}

/// One line per run that planned with a verification model: its T_fix, T_lin and T_tok in milliseconds.
fn verify_model_table(results: &[(Summary, Vec<RoundTrace>)]) -> String {
    let mut s = String::new();
    for (r, _) in results {
        if let Some(m) = r.verify_model {
            s.push_str(&format!(
                "{:<11} T_fix {:.3} + T_lin {:.3} per device + T_tok {:.3} per drafted token\n",
                r.scheme,
                m.fixed_s * 1e3,
                m.per_device_s * 1e3,
                m.per_draft_token_s * 1e3
            ));
        }
    }
    s.trim_end().to_owned()
}

fn device_table(summary: &Summary, texts: &[String]) -> String {
    let mut s = format!(
        "per device, scheme {} (goodput in tokens per simulated second)\n{:>6} {:>7} {:>9} {:>10} {:>7} {:>7}  text\n",
        summary.scheme, "device", "tokens", "goodput", "acceptance", "rounds", "dropped"
    );
    for (d, t) in summary.devices.iter().zip(texts) {
        s.push_str(&format!(
            "{:>6} {:>7} {:>9.2} {:>10} {:>7} {:>7}  {}\n",
            d.device,
            d.tokens,
            d.goodput,
            d.acceptance.map_or("n/a".into(), |a| format!("{a:.3}")),
            d.rounds,
            d.dropped,
            t.replace('\n', " ")
        ));
    }
    s.trim_end().to_owned()
}

/// `--plan-budget-ms`: a number of milliseconds ≥ 0, or `none` for no budget.
pub fn plan_budget(text: &str) -> Result<Option<Duration>, Failure> {
    if text == "none" {
        return Ok(None);
    }
    text.parse::<f64>()
        .ok()
        .and_then(|ms| Duration::try_from_secs_f64(ms / 1e3).ok())
        .map(Some)
        .ok_or_else(|| {
            Failure::Input(format!(
                "--plan-budget-ms: {text:?} is neither a number of milliseconds >= 0 nor `none`"
            ))
        })
}

/// `s` seconds as a duration, or an input error naming `field` (NaN, infinite, zero, negative, or longer than
/// `spin_net::server::MAX_WAIT`, a year).
pub fn seconds(field: &str, s: f64) -> Result<Duration, Failure> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero() && *d <= spin_net::server::MAX_WAIT)
        .ok_or_else(|| {
            Failure::Input(format!(
                "{field}: {s} is not a number of seconds in (0, {}] (a year)",
                spin_net::server::MAX_WAIT.as_secs()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spin_optimize::round::Family;

    #[test]
    fn the_fixed_draft_length_is_read_by_its_name_and_by_its_older_one() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            server: ServerArgs,
        }
        use clap::Parser;
        for flag in ["--fixed-draft-len", "--fixed-len"] {
            let cli = Cli::try_parse_from(["multispin", flag, "6"]).unwrap();
            assert_eq!(cli.server.fixed_draft_len, Some(6), "{flag}");
        }
        let server = Cli::try_parse_from(["multispin"]).unwrap().server;
        assert_eq!(
            server.fixed_draft_len(Scheme::Fixed).unwrap(),
            spin_optimize::paper_a::baselines::FIXED_DRAFT_LEN,
            "the default is paper A's L̄, as in `multispin plan`"
        );
        let short = Cli::try_parse_from(["multispin", "--max-draft-len", "3"])
            .unwrap()
            .server;
        assert_eq!(
            short.fixed_draft_len(Scheme::Fixed).unwrap(),
            3,
            "lowered to --max-draft-len"
        );
    }

    /// The test vectors of docs/protocol.md §"The tokenizer fingerprint": the embedded tok512, and SmolLM2's GGUF
    /// vocabulary when it is in the cache (a visible skip otherwise). tok512's is also rebuilt from the rule on its
    /// pieces, byte by byte as the doc states it.
    #[test]
    fn tokenizer_fingerprints_match_the_documented_vectors() {
        let tok = load_tokenizer(None, None, 512).unwrap();
        // The rule on the pieces of models/tok512.bin (llama2.c: u32 max length, then per token f32 score, i32
        // length, bytes): ids 0–2 give nothing, a byte piece `<0xHH>` its byte, any other piece its bytes less one
        // leading space; each as lossy UTF-8, then a zero byte.
        let file: &[u8] = include_bytes!("../../../models/tok512.bin");
        let (mut at, mut text) = (4usize, Vec::new());
        for id in 0..512u32 {
            let len = i32::from_le_bytes(file[at + 4..at + 8].try_into().unwrap()) as usize;
            let piece = &file[at + 8..at + 8 + len];
            at += 8 + len;
            let bytes: Vec<u8> = if id < 3 {
                Vec::new()
            } else if id < 259 && piece.starts_with(b"<0x") && piece.len() == 6 {
                vec![(id - 3) as u8]
            } else {
                piece.strip_prefix(b" ").unwrap_or(piece).to_vec()
            };
            text.extend_from_slice(String::from_utf8_lossy(&bytes).as_bytes());
            text.push(0);
        }
        assert_eq!(at, file.len());
        assert_eq!(tokenizer_fingerprint(&tok, 512), fingerprint(&text));
        assert_eq!(tokenizer_fingerprint(&tok, 512), 0xcf59_9ac0_126c_536c);
        let cache = std::env::var_os("MULTISPIN_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/multispin")));
        let gguf = cache.map(|c| c.join("SmolLM2-135M-Instruct.Q4_1.gguf"));
        match gguf.filter(|p| p.exists()) {
            Some(p) => {
                let tok = load_tokenizer(None, Some(&p), 49152).unwrap();
                assert_eq!(tokenizer_fingerprint(&tok, 49152), 0x659a_6243_f064_a0e4);
            }
            None => {
                eprintln!("skipped: SmolLM2-135M-Instruct.Q4_1.gguf is not in the cache ($MULTISPIN_CACHE)")
            }
        }
    }

    /// The `--scheme` help of `simulate` and `serve` is prose; it must name exactly the schemes a server plans with
    /// (`Scheme::PER_ROUND`, the one list), in that order, and no offline reference.
    #[test]
    fn scheme_help_names_the_per_round_schemes_in_order() {
        let cmd = ServerArgs::augment_args(clap::Command::new("server"));
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id() == "scheme")
            .expect("--scheme exists");
        let help = arg.get_help().expect("--scheme has help").to_string();
        let mut from = 0;
        for s in Scheme::PER_ROUND {
            let at = help[from..]
                .find(s.name())
                .unwrap_or_else(|| panic!("{} missing or out of order in {help}", s.name()));
            from += at + s.name().len();
        }
        for s in Scheme::ALL.into_iter().filter(|s| s.is_offline_reference()) {
            assert!(!help.contains(s.name()), "{s} in {help}");
        }
        assert!(Scheme::PER_ROUND.iter().any(|s| s.family() == Family::Unified));
        assert_eq!(arg.get_default_values(), ["best"]);
        assert!(Scheme::parse_per_round("best").is_ok());
    }
}
