//! Paper A's baselines (§VI-A4): Fixed BW&L, Uni-BW, P2P-SPIN and Cen-SPIN (Homo lives in `homogeneous`).
//! Every modelling choice the paper leaves open is a named, documented parameter.

use super::bandwidth::fit_to_budget;
use super::scenario::{Plan, Scenario};
use crate::OptimizeError;

/// Fixed BW&L: every device drafts `draft_len` tokens (paper: L̄ = 8) and gets B/K.
pub fn fixed(s: &Scenario, draft_len: u32) -> Result<Plan, OptimizeError> {
    if !s.draft_range().contains(&draft_len) {
        return Err(OptimizeError::Invalid {
            field: "fixed_draft_len".into(),
            reason: format!(
                "{draft_len} is outside [{}, {}]",
                s.min_draft_len, s.max_draft_len
            ),
        });
    }
    let mut shares = vec![s.bandwidth_hz / s.len() as f64; s.len()];
    fit_to_budget(&mut shares, s.bandwidth_hz);
    Plan::evaluated(s, vec![draft_len; s.len()], shares)
}

/// The paper's Fixed BW&L draft length L̄ = 8.
pub const FIXED_DRAFT_LEN: u32 = 8;

/// The draft length Fixed BW&L uses when none is given: the paper's L̄ = 8 if the scenario allows it, otherwise
/// the allowed length nearest to it (L_max when L_max < 8, L_min when L_min > 8). A length the user gives is
/// never moved: [`fixed`] refuses one outside the range, naming `fixed_draft_len`.
pub fn default_fixed_draft_len(s: &Scenario) -> u32 {
    FIXED_DRAFT_LEN.clamp(s.min_draft_len, s.max_draft_len)
}

/// Uni-BW: equal bandwidth B/K, heterogeneous lengths.
///
/// ⟨C⟩ The paper applies its relax-and-round procedure; with bandwidth fixed, the problem separates exactly: for a
/// cap φ on the multi-access latency each device drafts the most tokens that fit, L_k = ⌊φ/θ_k⌋ with
/// θ_k = T_k^S + Q_tok K/(B r_k), and only the K·L_max values φ = l·θ_k can be optimal. We enumerate them, so
/// this baseline is the true optimum under equal bandwidth (never weaker than relax-and-round).
pub fn uni_bw(s: &Scenario) -> Result<Plan, OptimizeError> {
    let k = s.len() as f64;
    let share = s.bandwidth_hz / k;
    let theta: Vec<f64> = s
        .devices
        .iter()
        .map(|d| d.draft_token_s + d.hz_s_per_token / share)
        .collect();
    let verify = s.verify_s();
    let floor_cap = theta
        .iter()
        .map(|t| f64::from(s.min_draft_len) * t)
        .fold(0.0, f64::max);
    let mut caps: Vec<f64> = theta
        .iter()
        .flat_map(|&t| s.draft_range().map(move |l| f64::from(l) * t))
        .filter(|&c| c >= floor_cap)
        .collect();
    caps.sort_by(f64::total_cmp);
    caps.dedup();
    // ⌊cap/θ⌋ with a relative guard so that cap = l·θ itself yields l, clamped to the range; nondecreasing in cap.
    let length_at = |cap: f64, t: f64| {
        let l = (cap / t * (1.0 + 1e-12)).floor();
        (l as u32).clamp(s.min_draft_len, s.max_draft_len)
    };
    // Sweep the caps upwards; device k reaches length l at the first cap where `length_at` says so (a binary search,
    // the predicate being monotone), so the whole sweep costs O(K·L log(K·L)) rather than O(K²·L).
    let mut events: Vec<(usize, usize, u32)> = Vec::new();
    let mut lens: Vec<u32> = Vec::with_capacity(theta.len());
    for (k, &t) in theta.iter().enumerate() {
        let first = caps.first().map_or(s.min_draft_len, |&c| length_at(c, t));
        lens.push(first);
        for l in first + 1..=s.max_draft_len {
            let at = caps.partition_point(|&c| length_at(c, t) < l);
            if at == caps.len() {
                break;
            }
            events.push((at, k, l));
        }
    }
    events.sort_unstable();
    // Σ_k E_k(L_k) kept as a compensated (Neumaier) running sum, so that it stays within a few ulps of the direct
    // sum however many events change it.
    let mut tokens = Neumaier::default();
    for (d, &l) in s.devices.iter().zip(&lens) {
        tokens.add(d.expected_tokens(l));
    }
    let mut latency = lens
        .iter()
        .zip(&theta)
        .map(|(&l, &t)| f64::from(l) * t)
        .fold(0.0, f64::max);
    let mut best: Option<(f64, usize)> = None;
    let mut next = 0;
    for i in 0..caps.len() {
        while next < events.len() && events[next].0 == i {
            let (_, k, l) = events[next];
            let d = &s.devices[k];
            tokens.add(d.expected_tokens(l));
            tokens.add(-d.expected_tokens(lens[k]));
            lens[k] = l;
            latency = latency.max(f64::from(l) * theta[k]);
            next += 1;
        }
        let tau = tokens.value() / (latency + verify);
        if best.is_none_or(|b| tau > b.0) {
            best = Some((tau, i));
        }
    }
    let best = best.map(|(tau, i)| {
        (
            tau,
            theta.iter().map(|&t| length_at(caps[i], t)).collect::<Vec<u32>>(),
        )
    });
    let (_, lens) = best.ok_or_else(|| OptimizeError::Infeasible {
        reason: "uni-bw: no draft length fits".into(),
    })?;
    let mut shares = vec![share; s.len()];
    fit_to_budget(&mut shares, s.bandwidth_hz);
    Plan::evaluated(s, lens, shares)
}

/// A compensated running sum (Neumaier's variant of Kahan summation).
#[derive(Default)]
struct Neumaier {
    sum: f64,
    compensation: f64,
}

impl Neumaier {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.compensation += (self.sum - t) + x;
        } else {
            self.compensation += (x - t) + self.sum;
        }
        self.sum = t;
    }

    fn value(&self) -> f64 {
        self.sum + self.compensation
    }
}

/// The goodput of a protocol baseline that is not a Multi-SPIN plan (no shared band).
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolOutcome {
    /// The draft length of each device (P2P) or the common one (Cen-SPIN, repeated).
    pub draft_lengths: Vec<u32>,
    /// System goodput in tokens per second.
    pub goodput_tokens_per_s: f64,
}

/// P2P-SPIN: one device at a time holds the whole band B and is verified alone (T_ver(1) = T_fix + T_lin); its
/// L is chosen by exhaustive search to maximise its own goodput.
///
/// ⟨C⟩ The devices are served round-robin, one round each in turn, so the system goodput is the renewal–reward
/// rate Σ_k E[N_k | L_k] / Σ_k (L_k(T_k^S + Q_tok/(B r_k)) + T_ver(1)).
pub fn p2p(s: &Scenario) -> ProtocolOutcome {
    let verify_one = s.verify_fixed_s + s.verify_per_device_s;
    let (mut tokens, mut time) = (0.0, 0.0);
    let mut lens = Vec::with_capacity(s.len());
    for d in &s.devices {
        let per_token = d.draft_token_s + d.hz_s_per_token / s.bandwidth_hz;
        let best = s
            .draft_range()
            .map(|l| (d.expected_tokens(l), f64::from(l) * per_token + verify_one, l))
            .max_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)))
            .unwrap_or((1.0, verify_one, s.min_draft_len));
        tokens += best.0;
        time += best.1;
        lens.push(best.2);
    }
    ProtocolOutcome {
        draft_lengths: lens,
        goodput_tokens_per_s: tokens / time,
    }
}

/// Cen-SPIN's server-side drafting cost, which paper A does not state ⟨C⟩.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CenParams {
    /// Time of one drafting step of the SLM on the server for a batch of one prompt, in seconds.
    pub server_draft_fixed_s: f64,
    /// Extra time per additional prompt in the drafting batch, in seconds (an affine model like eq. 7). Setting
    /// it equal to `server_draft_fixed_s` with a zero fixed part models unbatched, one-prompt-at-a-time drafting.
    pub server_draft_per_prompt_s: f64,
}

/// Cen-SPIN: the server drafts for all K prompts (affine batched drafting) and verifies them in one batch;
/// devices only send prompts and receive tokens (latency neglected, as paper A neglects the downlink). The common
/// L is chosen by exhaustive search: τ = Σ_k E[N_k | L] / (L(t_0 + K t_1) + T_ver(K)).
pub fn cen(s: &Scenario, params: &CenParams) -> Result<ProtocolOutcome, OptimizeError> {
    OptimizeError::non_negative("server_draft_fixed_s", params.server_draft_fixed_s)?;
    OptimizeError::non_negative("server_draft_per_prompt_s", params.server_draft_per_prompt_s)?;
    let step = params.server_draft_fixed_s + s.len() as f64 * params.server_draft_per_prompt_s;
    let verify = s.verify_s();
    let best = s
        .draft_range()
        .map(|l| {
            let tokens: f64 = s.devices.iter().map(|d| d.expected_tokens(l)).sum();
            (tokens / (f64::from(l) * step + verify), l)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap_or((0.0, s.min_draft_len));
    Ok(ProtocolOutcome {
        draft_lengths: vec![best.1; s.len()],
        goodput_tokens_per_s: best.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force};
    use crate::paper_a::testing::random_scenario;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn uni_bw_is_optimal_under_equal_bandwidth() {
        // Exhaustive search over L with B_k = B/K fixed.
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        for _ in 0..40 {
            let s = random_scenario(&mut rng, 3, 8);
            let plan = uni_bw(&s).unwrap();
            let share = s.bandwidth_hz / 3.0;
            let mut best = 0.0f64;
            for a in 1..=8 {
                for b in 1..=8 {
                    for c in 1..=8 {
                        best = best.max(s.evaluate(&[a, b, c], &[share; 3]).unwrap().0);
                    }
                }
            }
            assert!((plan.goodput_tokens_per_s - best).abs() <= 1e-12 * best);
            // And never above the joint optimum.
            let exact = brute_force(&s, BRUTE_FORCE_LIMIT).unwrap();
            assert!(plan.goodput_tokens_per_s <= exact.goodput_tokens_per_s * (1.0 + 1e-12));
        }
    }

    #[test]
    fn fixed_and_protocol_baselines() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let s = random_scenario(&mut rng, 6, 25);
        let plan = fixed(&s, 8).unwrap();
        assert!(plan.draft_lengths.iter().all(|&l| l == 8));
        assert!(
            fixed(&s, 40)
                .unwrap_err()
                .to_string()
                .starts_with("fixed_draft_len")
        );
        let p = p2p(&s);
        assert_eq!(p.draft_lengths.len(), 6);
        assert!(p.goodput_tokens_per_s > 0.0);
        let c = cen(
            &s,
            &CenParams {
                server_draft_fixed_s: 0.01,
                server_draft_per_prompt_s: 0.001,
            },
        )
        .unwrap();
        assert!(c.goodput_tokens_per_s > 0.0);
        assert!(
            cen(
                &s,
                &CenParams {
                    server_draft_fixed_s: -1.0,
                    server_draft_per_prompt_s: 0.0
                }
            )
            .is_err()
        );
    }
}
