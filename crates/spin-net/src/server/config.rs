//! The server's settings (what an operator sets: clock, compute, planner, link, deadlines and admission limits) and
//! their checks.

use super::*;
use crate::error::number;

/// Which clock a round is accounted on.
/// The longest draft the server lets a round plan (`max_draft_len`): every draft is drafted, sent and verified in a
/// live round (K · (L_max + 1) positions in one batched pass, up to L_max distributions in each uplink message),
/// so this is far below what the offline planners accept (`spin_optimize::paper_a::scenario::MAX_DRAFT_LEN_LIMIT`,
/// 1024, and `spin_optimize::paper_b::scenario::MAX_DRAFT_LEN_LIMIT`, 1000, which bound tables and samples).
pub const MAX_SERVED_DRAFT_LEN: u32 = 64;

/// The longest wait a setting may ask for (a year): every wait becomes a deadline, an instant that far ahead is as
/// good as never, and one much further would not be representable (adding it to the clock would overflow). The
/// server's durations and the device's are held to it.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The default of [`ServerConfig::keepalive_every`]: a twelfth of a device's default silence timeout
/// (`crate::device::DEFAULT_SILENCE_TIMEOUT`), six bytes on the wire per device.
pub const DEFAULT_KEEPALIVE_EVERY: Duration = Duration::from_secs(5);

/// The default of [`ServerConfig::max_devices`]; `simulate` holds its device counts to it too.
pub const DEFAULT_MAX_DEVICES: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// Simulated time: drafting, air and verification times are added up; nothing waits. Deterministic with a
    /// compute profile.
    Virtual,
    /// Wall time: messages are held for their air time; compute is what this machine takes.
    Real,
}

/// Where compute times come from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Compute {
    /// Measured on this machine (devices report their drafting time; the server times its forward pass).
    Measured,
    /// A compute profile: per-token drafting time T̄·U[1, 1 + spread] per device (seeded), T_ver = T_fix + K·T_lin
    /// + T_tok·Σ L_k.
    Profile {
        /// T̄ in seconds per token.
        draft_token_s: f64,
        /// Spread of the per-device factor.
        draft_spread: f64,
        /// T_fix in seconds.
        verify_fixed_s: f64,
        /// T_lin in seconds per device.
        verify_per_device_s: f64,
        /// T_tok in seconds per drafted token in the batch (0: the papers' model).
        verify_per_draft_token_s: f64,
    },
}

impl Compute {
    /// A profile's T_ver(K, L); None under measured compute (it is fitted from the timed passes there).
    pub fn profile_verify(&self) -> Option<crate::controller::VerifyModel> {
        match *self {
            Compute::Profile {
                verify_fixed_s,
                verify_per_device_s,
                verify_per_draft_token_s,
                ..
            } => Some(crate::controller::VerifyModel {
                fixed_s: verify_fixed_s,
                per_device_s: verify_per_device_s,
                per_draft_token_s: verify_per_draft_token_s,
            }),
            Compute::Measured => None,
        }
    }

    /// T_ver(K, L) to plan with: the profile's, or under measured compute `fit`'s model of the passes timed so far
    /// ([`crate::controller::UNTIMED_VERIFY`] before the first).
    pub fn planning_verify(&self, fit: &crate::controller::VerifyFit) -> crate::controller::VerifyModel {
        self.profile_verify()
            .unwrap_or_else(|| fit.model().unwrap_or(crate::controller::UNTIMED_VERIFY))
    }
}

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The planning scheme (its paper fixes the exchange).
    pub scheme: Scheme,
    /// Paper B's reactive mode policy.
    pub modes: ModeScheme,
    /// L_max / γ_max.
    pub max_draft_len: u32,
    /// Fixed BW&L's length.
    pub fixed_draft_len: u32,
    /// V_eff of every distribution on the air (capped at V).
    pub v_eff: u32,
    /// Q of every distribution on the air.
    pub q_bits: u8,
    /// At temperature 0 (top-1 sampling), send (token, probability) pairs from every device whatever the scheme and
    /// correct every rejection at the server with the target's token: greedy verification needs nothing else, so no
    /// distribution goes on the air (paper A's with every drafted token, paper B's exchange after a rejection).
    /// Off (the default), the papers' payloads at every temperature (docs/system.md, "Greedy payload").
    pub greedy_payload: bool,
    /// Sampling temperature (0 = greedy).
    pub temperature: f64,
    /// Tokens each device generates.
    pub max_new_tokens: usize,
    /// End of sequence.
    pub eos: Option<u32>,
    /// Seed of every draw (sampling, drop, fading, planners).
    pub seed: u64,
    /// The clock.
    pub clock: Clock,
    /// Compute times.
    pub compute: Compute,
    /// The radio.
    pub link: LinkConfig,
    /// A draft that arrives later than this after the plan (on the run's clock) is dropped for the round.
    pub round_deadline_s: f64,
    /// Wall-clock limit on waiting for a device's answer in a round (its draft, its correction), on either clock:
    /// a device silent past it is dropped for the round (`silent` in the trace) and the others go on.
    pub wall_deadline: Duration,
    /// A connection that has not sent a complete `Hello` within this is closed (slow or idle peers).
    pub handshake_timeout: Duration,
    /// Open connections at most (handshakes included); one more is answered `Full` and closed.
    pub max_connections: usize,
    /// Open connections at most from one IP address.
    pub max_connections_per_addr: usize,
    /// Sessions at most that have not drafted yet (connected or waiting to resume); a new one beyond is `Full`.
    pub max_pending: usize,
    /// Of those, at most this many opened from one IP address.
    pub max_pending_per_addr: usize,
    /// While fewer than `min_devices` joined, a notice says whom the server waits for this often.
    pub notice_every: Duration,
    /// While the server waits (for devices to join, for drafts, for resumes), every connected device is sent a
    /// `KeepAlive` this often, so that a device can tell a waiting server from a hung one
    /// (`DeviceConfig::silence_timeout`, 60 s by default, must stay well above it).
    pub keepalive_every: Duration,
    /// TLS on every connection (None: plaintext, for loopback and simulations).
    pub tls: Option<ServerTls>,
    /// The pre-shared admission tokens a `Hello` must carry one of (empty: any device is admitted).
    pub device_tokens: Vec<Vec<u8>>,
    /// Rounds start once this many devices joined.
    pub min_devices: usize,
    /// Devices admitted at most.
    pub max_devices: usize,
    /// Stop after this many rounds.
    pub max_rounds: Option<u64>,
    /// Stop once every device has finished (else wait for new devices until shut down).
    pub stop_when_done: bool,
    /// How long a disconnected session waits for its device to resume; at its end the session is released (its
    /// memory freed, a resume refused) and a run whose other devices finished ends.
    pub resume_window: Duration,
    /// The target model's identity.
    pub identity: Identity,
    /// Largest frame body.
    pub max_frame_bytes: usize,
    /// Prior α₀ of the acceptance estimate.
    pub alpha_prior: f64,
    /// Weight n₀ of the prior in tokens.
    pub alpha_prior_weight: f64,
    /// How much a round's acceptance evidence counts one round later, in (0, 1]: 1 never forgets (the estimate of
    /// every round, as the papers' controllers keep it); the default 0.97 has a half-life of about 23 rounds.
    pub alpha_memory: f64,
    /// SAA samples for paper B's planners.
    pub saa_samples: u32,
    /// On the real clock, the wall time a round's planning may take (between the last round's verdicts and this
    /// round's plans, when every device waits): `best`'s exhaustive step and the unified branch and bound stop there
    /// with their best plan so far; the heuristic searches always complete, so a round may overrun it by their
    /// cost. None: unbounded. The virtual clock does not charge planning and never applies it (plans stay
    /// reproducible).
    pub plan_budget: Option<Duration>,
}

/// The default [`ServerConfig::plan_budget`]: a fraction of a real-model round on a CPU server (a SmolLM2-135M
/// pass over four devices' drafts takes 8–10 ms on two cores, docs/system.md).
pub const DEFAULT_PLAN_BUDGET: Duration = Duration::from_millis(2);

impl ServerConfig {
    /// Defaults for `scheme` (paper B's link, V_eff = 1024, Q = 16, γ_max = 8, a compute profile on the virtual
    /// clock) and the target's `identity`.
    pub fn new(scheme: Scheme, identity: Identity) -> Self {
        ServerConfig {
            scheme,
            modes: ModeScheme::Optimal,
            max_draft_len: 8,
            fixed_draft_len: spin_optimize::paper_a::baselines::FIXED_DRAFT_LEN,
            v_eff: 1024,
            greedy_payload: false,
            q_bits: 16,
            temperature: 0.0,
            max_new_tokens: 32,
            eos: None,
            seed: 0,
            clock: Clock::Virtual,
            compute: Compute::Profile {
                draft_token_s: 0.015,
                draft_spread: 0.15,
                verify_fixed_s: 0.04,
                verify_per_device_s: 0.008,
                verify_per_draft_token_s: 0.0,
            },
            link: LinkConfig::paper_b(),
            round_deadline_s: 10.0,
            wall_deadline: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(5),
            max_connections: 2048,
            max_connections_per_addr: 64,
            max_pending: 256,
            max_pending_per_addr: 32,
            notice_every: Duration::from_secs(5),
            keepalive_every: DEFAULT_KEEPALIVE_EVERY,
            tls: None,
            device_tokens: Vec::new(),
            min_devices: 1,
            max_devices: DEFAULT_MAX_DEVICES,
            max_rounds: None,
            stop_when_done: true,
            resume_window: Duration::from_secs(10),
            identity,
            max_frame_bytes: proto::MAX_FRAME_BYTES,
            alpha_prior: 0.7,
            alpha_prior_weight: 8.0,
            alpha_memory: 0.97,
            saa_samples: 200,
            plan_budget: Some(DEFAULT_PLAN_BUDGET),
        }
    }

    pub(super) fn exchange(&self) -> Exchange {
        match self.scheme.family() {
            Family::PaperA => Exchange::DistsWithDraft,
            Family::PaperB => Exchange::ProbsOnly,
            Family::Unified => Exchange::Planned,
        }
    }

    /// Checks the settings; every error names its field.
    pub fn validate(&self) -> Result<()> {
        self.link.validate()?;
        if !(1..=24).contains(&self.q_bits) {
            return Err(NetError::invalid(
                "q_bits",
                format!("{} is outside [1, 24]", self.q_bits),
            ));
        }
        if self.v_eff == 0 {
            return Err(NetError::invalid("v_eff", "must be at least 1"));
        }
        if self.max_draft_len == 0 || self.max_draft_len > MAX_SERVED_DRAFT_LEN {
            return Err(NetError::invalid(
                "max_draft_len",
                format!("{} is outside [1, {MAX_SERVED_DRAFT_LEN}]", self.max_draft_len),
            ));
        }
        if self.round_deadline_s.is_nan() || self.round_deadline_s <= 0.0 {
            return Err(NetError::invalid(
                "round_deadline_s",
                format!("{} is not a number > 0", number(self.round_deadline_s)),
            ));
        }
        for (field, d) in [
            ("wall_deadline", self.wall_deadline),
            ("handshake_timeout", self.handshake_timeout),
            ("notice_every", self.notice_every),
            ("keepalive_every", self.keepalive_every),
        ] {
            if d.is_zero() {
                return Err(NetError::invalid(field, "must be longer than 0 s"));
            }
        }
        for (field, d) in [
            ("wall_deadline", Some(self.wall_deadline)),
            ("handshake_timeout", Some(self.handshake_timeout)),
            ("notice_every", Some(self.notice_every)),
            ("keepalive_every", Some(self.keepalive_every)),
            ("resume_window", Some(self.resume_window)),
            ("plan_budget", self.plan_budget),
        ] {
            check_wait(field, d.unwrap_or_default())?;
        }
        for (field, n) in [
            ("max_connections", self.max_connections),
            ("max_connections_per_addr", self.max_connections_per_addr),
            ("max_pending", self.max_pending),
            ("max_pending_per_addr", self.max_pending_per_addr),
        ] {
            if n == 0 {
                return Err(NetError::invalid(field, "must be at least 1"));
            }
        }
        if !(self.alpha_prior > 0.0 && self.alpha_prior < 1.0) {
            return Err(NetError::invalid(
                "alpha_prior",
                format!("{} is outside (0, 1)", number(self.alpha_prior)),
            ));
        }
        if !(self.alpha_memory > 0.0 && self.alpha_memory <= 1.0) {
            return Err(NetError::invalid(
                "alpha_memory",
                format!("{} is outside (0, 1]", number(self.alpha_memory)),
            ));
        }
        if !(self.alpha_prior_weight >= 0.0 && self.alpha_prior_weight.is_finite()) {
            return Err(NetError::invalid(
                "alpha_prior_weight",
                format!("{} is not a finite number ≥ 0", number(self.alpha_prior_weight)),
            ));
        }
        if self.min_devices == 0 || self.min_devices > self.max_devices {
            return Err(NetError::invalid(
                "min_devices",
                format!(
                    "{} is outside [1, max_devices = {}]",
                    self.min_devices, self.max_devices
                ),
            ));
        }
        if let Compute::Profile {
            draft_token_s,
            draft_spread,
            verify_fixed_s,
            verify_per_device_s,
            verify_per_draft_token_s,
        } = self.compute
        {
            for (f, v, pos) in [
                ("draft_token_s", draft_token_s, true),
                ("draft_spread", draft_spread, false),
                ("verify_fixed_s", verify_fixed_s, false),
                ("verify_per_device_s", verify_per_device_s, false),
                ("verify_per_draft_token_s", verify_per_draft_token_s, false),
            ] {
                if !(v.is_finite() && (v > 0.0 || (!pos && v == 0.0))) {
                    return Err(NetError::invalid(
                        f,
                        format!(
                            "{} is not a finite number {}",
                            number(v),
                            if pos { "> 0" } else { "≥ 0" }
                        ),
                    ));
                }
            }
            if verify_fixed_s + verify_per_device_s <= 0.0 {
                return Err(NetError::invalid(
                    "verify_fixed_s",
                    "T_fix + T_lin must be positive",
                ));
            }
            if self.clock == Clock::Real {
                return Err(NetError::invalid(
                    "compute",
                    "a compute profile needs the virtual clock (the real clock measures compute)",
                ));
            }
        }
        // 0 is greedy decoding; the sampler's own check names the field once more and calls 0 out of its domain.
        let t = self.temperature;
        if !(t == 0.0 || (t > 0.0 && t.is_finite())) {
            return Err(NetError::invalid(
                "temperature",
                format!("{} is neither 0 (greedy) nor a finite number > 0", number(t)),
            ));
        }
        sampling(t)?;
        Ok(())
    }
}

/// Refuses a wait longer than [`MAX_WAIT`], naming `field`.
pub fn check_wait(field: &str, d: Duration) -> Result<()> {
    if d > MAX_WAIT {
        return Err(NetError::invalid(
            field,
            format!(
                "{} s is above the limit of {} s (a year)",
                number(d.as_secs_f64()),
                MAX_WAIT.as_secs()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait beyond a year is refused by name: as a deadline it would overflow the clock and panic.
    #[test]
    fn waits_beyond_a_year_are_refused_naming_the_field() {
        let identity = Identity {
            vocab: 512,
            tokenizer: 0,
            model: 0,
        };
        let ok = ServerConfig::new(Scheme::parse_per_round("best").unwrap(), identity);
        ok.validate().unwrap();
        let long = Duration::from_secs(u64::MAX / 2);
        type Set = fn(&mut ServerConfig, Duration);
        let fields: [(&str, Set); 6] = [
            ("wall_deadline", |c, d| c.wall_deadline = d),
            ("handshake_timeout", |c, d| c.handshake_timeout = d),
            ("notice_every", |c, d| c.notice_every = d),
            ("keepalive_every", |c, d| c.keepalive_every = d),
            ("resume_window", |c, d| c.resume_window = d),
            ("plan_budget", |c, d| c.plan_budget = Some(d)),
        ];
        for (field, set) in fields {
            let mut c = ok.clone();
            set(&mut c, MAX_WAIT);
            c.validate().unwrap();
            set(&mut c, long);
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{field}: ")) && e.contains("a year"),
                "{e}"
            );
        }
        let mut c = ok.clone();
        c.keepalive_every = Duration::ZERO;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "keepalive_every: must be longer than 0 s"
        );
    }

    /// Every message names its field once and writes numbers as a person reads them (a library caller gets no
    /// `temperature: temperature: …` and no 309-digit number).
    #[test]
    fn validation_messages_name_the_field_once_with_short_numbers() {
        let identity = Identity {
            vocab: 512,
            tokenizer: 0,
            model: 0,
        };
        let ok = ServerConfig::new(Scheme::parse_per_round("best").unwrap(), identity);
        type Set = fn(&mut ServerConfig);
        let cases: [(Set, &str); 7] = [
            (
                |c| c.temperature = -1e308,
                "temperature: -1e308 is neither 0 (greedy) nor a finite number > 0",
            ),
            (
                |c| c.temperature = f64::NAN,
                "temperature: NaN is neither 0 (greedy) nor a finite number > 0",
            ),
            (|c| c.alpha_prior = 1e300, "alpha_prior: 1e300 is outside (0, 1)"),
            (|c| c.alpha_memory = 2.5, "alpha_memory: 2.5 is outside (0, 1]"),
            (
                |c| c.round_deadline_s = -1e200,
                "round_deadline_s: -1e200 is not a number > 0",
            ),
            (
                |c| c.link.bandwidth_hz = -1e-320,
                "bandwidth_hz: -1e-320 is not a finite number > 0",
            ),
            (
                |c| c.wall_deadline = Duration::from_secs(u64::MAX / 2),
                "wall_deadline: 9.223372036854776e18 s is above the limit of 31536000 s (a year)",
            ),
        ];
        for (set, want) in cases {
            let mut c = ok.clone();
            set(&mut c);
            assert_eq!(c.validate().unwrap_err().to_string(), want);
        }
        ok.validate().unwrap();
        let mut greedy = ok.clone();
        greedy.temperature = 0.0;
        greedy.validate().unwrap();
    }

    #[test]
    fn a_zero_keepalive_is_refused_naming_it() {
        let identity = Identity {
            vocab: 512,
            tokenizer: 0,
            model: 0,
        };
        let mut c = ServerConfig::new(Scheme::parse_per_round("best").unwrap(), identity);
        c.keepalive_every = Duration::ZERO;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "keepalive_every: must be longer than 0 s"
        );
    }
}
