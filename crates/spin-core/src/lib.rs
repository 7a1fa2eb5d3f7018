//! Exact speculative sampling for many devices: acceptance statistics, distributions, verification.
//!
//! This crate is a leaf of the workspace: it knows token ids and probability vectors, never models, sockets or
//! files, and every random draw comes in through a caller's `&mut impl Rng`, so results replay from a seed.
//!
//! The hot path borrows model output without copying: [`Dist`] is a validated view over `&[f32]` (or `&[f64]`),
//! [`PaddedTargets`] a view over a padded `[K, P, V]` batch. Every sampler takes `&mut C` with `C: Chance`, and
//! every [`rand::Rng`] is a [`Chance`].
//!
//! ```
//! use spin_core::{Dist, Draft, judge, sample_residual, Verdict};
//! use rand::SeedableRng;
//!
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
//! // The device drafted token 2 from q; the server holds p at positions 1 and 2.
//! let q = [0.2f32, 0.2, 0.6];
//! let p1 = [0.3f32, 0.4, 0.3];
//! let p2 = [0.5f32, 0.25, 0.25];
//! let (q, p1, p2) = (Dist::new(&q)?, Dist::new(&p1)?, Dist::new(&p2)?);
//! let draft = Draft::from_dists(&[2], &[q])?;
//! match judge(&[p1, p2], &draft, &mut rng)? {
//!     Verdict::AllAccepted { bonus, .. } => assert!(bonus < 3),
//!     Verdict::Rejected { position } => {
//!         assert_eq!(position, 0);
//!         // Residual max(0, p1 − q) puts all its mass on tokens 0 and 1.
//!         assert!(sample_residual(p1, q, &mut rng)? < 2);
//!     }
//! }
//! # Ok::<(), spin_core::CoreError>(())
//! ```

pub mod batch;
pub mod chance;
pub mod correction;
pub mod dist;
pub mod enumerate;
pub mod error;
pub mod estimate;
mod lanes;
pub mod stats;
pub mod verify;

pub use batch::{DraftRef, PaddedTargets, judge_batch, verify_batch, verify_batch_parallel};
pub use chance::{Categorical, Chance};
pub use correction::{Correction, Mode, Payload, Side, correct};
pub use dist::{Dist, ProbRows, SamplingParams, SparseDist, Truncator, Weight, probs_from_logits};
pub use error::CoreError;
pub use estimate::{AlphaEstimator, Estimate};
pub use stats::{AcceptanceRate, accepted_pmf, expected_accepted};
pub use verify::{Draft, Outcome, Residual, Verdict, acceptance_probability, judge, sample_residual, verify};
