//! The one scheme vocabulary: every planner of both papers and the unified planner, by one name each, with its
//! paper ([`Family`]) and its help line.

use crate::OptimizeError;
use std::fmt;
use std::str::FromStr;

/// Which paper a scheme comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Paper A: draft lengths and OFDMA bandwidth, distributions per token.
    PaperA,
    /// Paper B: draft lengths with UL/DL correction, pairs per token.
    PaperB,
    /// The unified model's joint planner.
    Unified,
}

impl Family {
    /// The name scenario files give it in their `model` field: `paper-a`, `paper-b` or `unified`.
    pub fn name(self) -> &'static str {
        match self {
            Family::PaperA => "paper-a",
            Family::PaperB => "paper-b",
            Family::Unified => "unified",
        }
    }
}

/// Every planning scheme of both papers and the unified planner, by one name each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Paper A: the exact integer optimum of (P2).
    Exact,
    /// Paper A: Algorithm 1 (relax and round on a grid).
    PaperAlg1,
    /// Paper A: common L, Lemma 1 bandwidth.
    Homo,
    /// Paper A: equal bandwidth, heterogeneous L.
    UniBw,
    /// Paper A: L = 8 and B/K for everyone.
    Fixed,
    /// Paper A: exhaustive search (small K).
    BruteForce,
    /// Paper B: the two-phase greedy.
    Greedy,
    /// Paper B: our multi-start local search.
    Best,
    /// Paper B: best common γ.
    Uniform,
    /// Paper B: computation-only control.
    CompOnly,
    /// Paper B: exhaustive search (small K).
    Exhaustive,
    /// The unified model's joint planner (draft lengths, uplink shares, payload, correction).
    Unified,
}

impl Scheme {
    /// Every scheme, in the order of [`Scheme::NAMES`].
    pub const ALL: [Scheme; 12] = [
        Scheme::Exact,
        Scheme::PaperAlg1,
        Scheme::Homo,
        Scheme::UniBw,
        Scheme::Fixed,
        Scheme::BruteForce,
        Scheme::Greedy,
        Scheme::Best,
        Scheme::Uniform,
        Scheme::CompOnly,
        Scheme::Exhaustive,
        Scheme::Unified,
    ];

    /// The command-line names, in the order of [`Scheme::ALL`].
    pub const NAMES: [&'static str; 12] = [
        "exact",
        "paper-alg1",
        "homo",
        "uni-bw",
        "fixed",
        "brute-force",
        "greedy",
        "best",
        "uniform",
        "comp-only",
        "exhaustive",
        "unified",
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        let i = Scheme::ALL.iter().position(|&s| s == self).unwrap_or(0);
        Scheme::NAMES[i]
    }

    /// The schemes a server can plan every round with (all but the offline references), in the order the
    /// networked system lists them (`multispin simulate --help`).
    pub const PER_ROUND: [Scheme; 10] = [
        Scheme::Exact,
        Scheme::PaperAlg1,
        Scheme::Homo,
        Scheme::UniBw,
        Scheme::Fixed,
        Scheme::Best,
        Scheme::Greedy,
        Scheme::Uniform,
        Scheme::CompOnly,
        Scheme::Unified,
    ];

    /// One line of help per scheme, as `multispin plan --help` lists it.
    pub fn help(self) -> &'static str {
        match self {
            Scheme::Exact => "Paper A: exact integer optimum of eq. 27 (docs/paper-a.md)",
            Scheme::PaperAlg1 => "Paper A: the paper's Algorithm 1",
            Scheme::Homo => "Paper A: homogeneous draft length with latency-equalising bandwidth",
            Scheme::UniBw => "Paper A: equal bandwidth B/K, heterogeneous draft lengths",
            Scheme::Fixed => "Paper A: equal bandwidth and one fixed draft length (see --fixed-draft-len)",
            Scheme::BruteForce => "Paper A: exhaustive search (small scenarios only)",
            Scheme::Greedy => "Paper B: the paper's two-phase greedy",
            Scheme::Best => "Paper B: multi-start local search (beyond the paper)",
            Scheme::Uniform => "Paper B: the best common draft length",
            Scheme::CompOnly => "Paper B: computation-only control (ignores the communication delay)",
            Scheme::Exhaustive => "Paper B: exhaustive search over {0..γ_max}^K (small scenarios only)",
            Scheme::Unified => {
                "Both papers: the unified model's joint planner (draft lengths, uplink shares, payload, \
                 correction mode; docs/unified.md). Takes every scenario; a `\"model\": \"unified\"` scenario \
                 takes every scheme"
            }
        }
    }

    /// Whether the scheme is an exhaustive reference for small offline instances (`brute-force`,
    /// `exhaustive`) rather than a planner a server may run every round.
    pub fn is_offline_reference(self) -> bool {
        matches!(self, Scheme::BruteForce | Scheme::Exhaustive)
    }

    /// The names of `schemes` as prose: `a, b, c or d`.
    pub fn name_list(schemes: impl IntoIterator<Item = Scheme>) -> String {
        let names: Vec<&str> = schemes.into_iter().map(Scheme::name).collect();
        match names.split_last() {
            None => String::new(),
            Some((last, [])) => (*last).to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        }
    }

    /// The schemes of `family`, in the order of [`Scheme::ALL`].
    pub fn of_family(family: Family) -> impl Iterator<Item = Scheme> {
        Scheme::ALL.into_iter().filter(move |s| s.family() == family)
    }

    /// Parses a scheme a server may plan every round with: any name of [`Scheme::NAMES`] except the offline
    /// references, which are refused with their reason. Errors name `scheme` and list [`Scheme::PER_ROUND`].
    pub fn parse_per_round(name: &str) -> Result<Scheme, OptimizeError> {
        let expected = || {
            Scheme::PER_ROUND
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let scheme: Scheme = name.parse().map_err(|_| OptimizeError::Invalid {
            field: "scheme".into(),
            reason: format!("unknown scheme {name:?}; expected one of {}", expected()),
        })?;
        if scheme.is_offline_reference() {
            return Err(OptimizeError::Invalid {
                field: "scheme".into(),
                reason: format!(
                    "{name} is an exhaustive reference for small offline instances, not a per-round planner; \
                     expected one of {}",
                    expected()
                ),
            });
        }
        Ok(scheme)
    }

    /// The paper the scheme comes from.
    pub fn family(self) -> Family {
        match self {
            Scheme::Exact
            | Scheme::PaperAlg1
            | Scheme::Homo
            | Scheme::UniBw
            | Scheme::Fixed
            | Scheme::BruteForce => Family::PaperA,
            Scheme::Greedy | Scheme::Best | Scheme::Uniform | Scheme::CompOnly | Scheme::Exhaustive => {
                Family::PaperB
            }
            Scheme::Unified => Family::Unified,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheme {
    type Err = OptimizeError;
    fn from_str(name: &str) -> Result<Scheme, OptimizeError> {
        Scheme::NAMES
            .iter()
            .position(|&n| n == name)
            .map(|i| Scheme::ALL[i])
            .ok_or_else(|| OptimizeError::Invalid {
                field: "scheme".into(),
                reason: format!(
                    "unknown scheme {name:?}; expected one of {}",
                    Scheme::NAMES.join(", ")
                ),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_names_round_trip_and_unknown_names_list_all() {
        for s in Scheme::ALL {
            assert_eq!(s.name().parse::<Scheme>().unwrap(), s);
            assert_eq!(s.to_string(), s.name());
        }
        let err = "exactt".parse::<Scheme>().unwrap_err().to_string();
        assert!(err.starts_with("scheme: unknown scheme \"exactt\""), "{err}");
        for n in Scheme::NAMES {
            assert!(err.contains(n), "{err} lacks {n}");
        }
    }

    #[test]
    fn per_round_schemes_help_lines_and_families() {
        // Every scheme has a help line of its own paper (one line, no trailing period: clap prints it as given).
        for s in Scheme::ALL {
            let h = s.help();
            let prefix = match s.family() {
                Family::PaperA => "Paper A: ",
                Family::PaperB => "Paper B: ",
                Family::Unified => "Both papers: ",
            };
            assert!(
                h.starts_with(prefix) && !h.ends_with('.') && !h.contains('\n'),
                "{s}: {h}"
            );
        }
        // The per-round subset is every scheme but the offline references, each once.
        let mut per_round: Vec<Scheme> = Scheme::PER_ROUND.to_vec();
        per_round.sort_by_key(|s| s.name());
        let mut expected: Vec<Scheme> = Scheme::ALL
            .into_iter()
            .filter(|s| !s.is_offline_reference())
            .collect();
        expected.sort_by_key(|s| s.name());
        assert_eq!(per_round, expected);
        for s in Scheme::ALL {
            let parsed = Scheme::parse_per_round(s.name());
            assert_eq!(parsed.is_ok(), !s.is_offline_reference(), "{s}");
        }
        let err = Scheme::parse_per_round("exhaustive").unwrap_err().to_string();
        assert!(
            err.starts_with("scheme: exhaustive is an exhaustive reference"),
            "{err}"
        );
        let err = Scheme::parse_per_round("bets").unwrap_err().to_string();
        assert!(
            err.ends_with("expected one of exact, paper-alg1, homo, uni-bw, fixed, best, greedy, uniform, comp-only, unified"),
            "{err}"
        );
        assert_eq!(
            Scheme::name_list(Scheme::of_family(Family::PaperB)),
            "greedy, best, uniform, comp-only or exhaustive"
        );
        assert_eq!(
            Scheme::name_list(Scheme::of_family(Family::PaperA)),
            "exact, paper-alg1, homo, uni-bw, fixed or brute-force"
        );
        assert_eq!(Scheme::name_list([Scheme::Unified]), "unified");
        assert_eq!(Scheme::name_list([]), "");
    }
}
