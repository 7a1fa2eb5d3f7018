//! `multispin plan` for paper-A scenarios: validate the file field by field, run the chosen scheme, print the
//! plan as JSON or as a table.

use crate::failure::Failure;
use crate::plan::{Format, PlanArgs, Scheme};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use spin_optimize::paper_a::baselines::{FIXED_DRAFT_LEN, fixed, uni_bw};
use spin_optimize::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force};
use spin_optimize::paper_a::exact::exact;
use spin_optimize::paper_a::heterogeneous::{Alg1Params, paper_alg1};
use spin_optimize::paper_a::homogeneous::homo;
use spin_optimize::paper_a::{DeviceSpec, Plan, Scenario, ScenarioSpec};

/// Reads one field of a JSON object into `T`; a missing or mistyped field is an input error naming its path.
fn field<T: DeserializeOwned>(obj: &Map<String, Value>, name: &str, path: &str) -> Result<T, Failure> {
    let value = obj
        .get(name)
        .ok_or_else(|| Failure::Input(format!("{path}{name}: missing")))?;
    serde_json::from_value(value.clone()).map_err(|e| Failure::Input(format!("{path}{name}: {e}")))
}

/// Like [`field`], with a default when the field is absent.
fn optional<T: DeserializeOwned>(obj: &Map<String, Value>, name: &str, default: T) -> Result<T, Failure> {
    match obj.get(name) {
        None => Ok(default),
        Some(_) => field(obj, name, ""),
    }
}

/// Builds the scenario spec from JSON, naming the field of any type error (serde alone would not).
fn spec_from_json(value: &Value) -> Result<ScenarioSpec, Failure> {
    let obj = value
        .as_object()
        .ok_or_else(|| Failure::Input("scenario: the top level must be a JSON object".into()))?;
    let devices_value = obj
        .get("devices")
        .ok_or_else(|| Failure::Input("devices: missing".into()))?;
    let list = devices_value
        .as_array()
        .ok_or_else(|| Failure::Input("devices: must be an array".into()))?;
    let devices = list
        .iter()
        .enumerate()
        .map(|(k, d)| {
            let path = format!("devices[{k}].");
            let d = d
                .as_object()
                .ok_or_else(|| Failure::Input(format!("devices[{k}]: must be an object")))?;
            Ok(DeviceSpec {
                acceptance: field(d, "acceptance", &path)?,
                draft_token_s: field(d, "draft_token_s", &path)?,
                spectral_efficiency: field(d, "spectral_efficiency", &path)?,
            })
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    Ok(ScenarioSpec {
        bandwidth_hz: field(obj, "bandwidth_hz", "")?,
        bits_per_draft_token: field(obj, "bits_per_draft_token", "")?,
        verify_fixed_s: field(obj, "verify_fixed_s", "")?,
        verify_per_draft_s: field(obj, "verify_per_draft_s", "")?,
        max_draft_len: field(obj, "max_draft_len", "")?,
        min_draft_len: optional(obj, "min_draft_len", 1)?,
        devices,
    })
}

/// The draft length of `fixed`: the command line, else the scenario's `fixed_draft_len`, else
/// [`FIXED_DRAFT_LEN`] (8) lowered to `max_draft_len` when that is smaller; an explicit value must lie in
/// [min_draft_len, max_draft_len] and is named by where it came from.
fn fixed_draft_len(s: &Scenario, flag: Option<u32>, file: Option<u32>) -> Result<u32, Failure> {
    let (value, field) = match (flag, file) {
        (Some(l), _) => (l, "--fixed-draft-len"),
        (None, Some(l)) => (l, "fixed_draft_len"),
        (None, None) => return Ok(FIXED_DRAFT_LEN.clamp(s.min_draft_len, s.max_draft_len)),
    };
    if !(s.min_draft_len..=s.max_draft_len).contains(&value) {
        return Err(Failure::Input(format!(
            "{field}: {value} is outside [min_draft_len, max_draft_len] = [{}, {}]",
            s.min_draft_len, s.max_draft_len
        )));
    }
    Ok(value)
}

/// Plans one round for a paper-A scenario.
pub fn run(value: Value, args: &PlanArgs) -> Result<(), Failure> {
    let spec = spec_from_json(&value)?;
    let obj = value.as_object().cloned().unwrap_or_default();
    let from_file: Option<u32> = optional(&obj, "fixed_draft_len", None)?;
    let defaults = Alg1Params::default();
    let alg1 = Alg1Params {
        phi_points: optional(&obj, "alg1_phi_points", defaults.phi_points)?,
        lambda_points: optional(&obj, "alg1_lambda_points", defaults.lambda_points)?,
        lambda_lo_ratio: optional(&obj, "alg1_lambda_lo_ratio", defaults.lambda_lo_ratio)?,
    };
    let scenario = Scenario::new(&spec).map_err(Failure::input)?;
    let fixed_len = fixed_draft_len(&scenario, args.fixed_draft_len, from_file)?;
    let plan = match args.scheme {
        Scheme::Exact => exact(&scenario),
        Scheme::PaperAlg1 => paper_alg1(&scenario, &alg1),
        Scheme::Homo => homo(&scenario),
        Scheme::UniBw => uni_bw(&scenario),
        Scheme::Fixed => fixed(&scenario, fixed_len),
        Scheme::BruteForce => brute_force(&scenario, BRUTE_FORCE_LIMIT),
        other => {
            return Err(Failure::Input(format!(
                "--scheme: {} is not a paper-a scheme",
                other.name()
            )));
        }
    }
    .map_err(Failure::input)?;
    let name = args.scheme.name();
    match args.format {
        Format::Json => println!("{}", to_json(name, &plan)),
        Format::Table => print!("{}", to_table(name, &scenario, &plan)),
    }
    Ok(())
}

/// The JSON contract: scheme, draft_lengths, bandwidth_hz, goodput_tokens_per_s, round_latency_s.
fn to_json(scheme: &str, plan: &Plan) -> Value {
    json!({
        "scheme": scheme,
        "draft_lengths": plan.draft_lengths,
        "bandwidth_hz": plan.bandwidth_hz,
        "goodput_tokens_per_s": plan.goodput_tokens_per_s,
        "round_latency_s": plan.round_latency_s,
    })
}

fn to_table(scheme: &str, s: &Scenario, plan: &Plan) -> String {
    let mut out = format!(
        "scheme: {scheme}\ngoodput: {:.3} tokens/s\nround latency: {:.3} ms\n\n{:>6} {:>9} {:>9} {:>10} {:>12} {:>12}\n",
        plan.goodput_tokens_per_s,
        plan.round_latency_s * 1e3,
        "device",
        "alpha",
        "L",
        "T_S (ms)",
        "r (b/s/Hz)",
        "B_k (kHz)"
    );
    for (k, (d, (&l, &b))) in s
        .devices
        .iter()
        .zip(plan.draft_lengths.iter().zip(&plan.bandwidth_hz))
        .enumerate()
    {
        out.push_str(&format!(
            "{k:>6} {:>9.4} {l:>9} {:>10.3} {:>12.3} {:>12.3}\n",
            d.alpha,
            d.draft_token_s * 1e3,
            d.spectral_efficiency,
            b / 1e3
        ));
    }
    out
}
