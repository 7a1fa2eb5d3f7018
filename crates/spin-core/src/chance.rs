//! The two random decisions speculative sampling makes (a biased coin, a categorical draw), behind one trait.
//!
//! Every sampler in this crate draws through [`Chance`]. Any [`rand::Rng`] is a `Chance` (one 53-bit uniform per
//! decision), and [`crate::enumerate::Enumerator`] is another one that walks every branch with its exact probability,
//! so the exact-enumeration tests exercise the very code paths the samplers run.
//!
//! Categorical draws use the inverse CDF with one uniform. Weights are summed in `f64` in blocks of
//! [`BLOCK`] entries, each block with eight independent lanes (so the sum vectorises), and the blocks in order;
//! the walk recomputes the same block sums, so the cumulative sum it compares against reaches the same total.

use rand::Rng;

/// Entries per block of the blocked inverse-CDF walk.
pub const BLOCK: usize = 64;

/// A discrete distribution over `0..len()` given by non-negative, finite, unnormalised `f64` weights.
///
/// Implementors guarantee that [`Categorical::block_sum`] adds exactly the values [`Categorical::weight`] returns,
/// and that [`Categorical::total`] is the in-order sum of the block sums over consecutive blocks of [`BLOCK`]
/// entries (see [`blocked_total`]). Both hold for the types of this crate.
pub trait Categorical {
    /// The number of outcomes.
    fn len(&self) -> usize;
    /// Whether there are no outcomes (never true for the validated types of this crate).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The unnormalised weight of outcome `i < len()`.
    fn weight(&self, i: usize) -> f64;
    /// The sum of the weights of `start..end` (at most [`BLOCK`] entries) in the crate's fixed lane order.
    fn block_sum(&self, start: usize, end: usize) -> f64;
    /// The total weight, `blocked_total(self)`; implementors cache it.
    fn total(&self) -> f64;

    /// The block sums, in order, if the implementor has them cached (then the walk reads one block only).
    fn cached_block_sums(&self) -> Option<&[f64]> {
        None
    }

    /// The outcome whose cumulative-weight interval contains `u · total()`, for `u ∈ [0, 1)`.
    ///
    /// Never returns an outcome of zero weight; if rounding leaves `u · total()` beyond the walked sum, the last
    /// outcome of positive weight is returned. Callers guarantee `total() > 0`.
    fn inverse_cdf(&self, u: f64) -> usize {
        let target = u * self.total();
        let n = self.len();
        let mut cum = 0.0;
        let mut last_positive_block = (0, 0);
        let cached = self.cached_block_sums();
        let mut start = 0;
        while start < n {
            let end = (start + BLOCK).min(n);
            let s = match cached {
                Some(b) => b[start / BLOCK],
                None => self.block_sum(start, end),
            };
            if s > 0.0 {
                if cum + s > target {
                    let mut c = cum;
                    let mut last = start;
                    for i in start..end {
                        let w = self.weight(i);
                        if w > 0.0 {
                            c += w;
                            last = i;
                            if c > target {
                                return i;
                            }
                        }
                    }
                    // The in-block sequential sum fell short of the lane sum by rounding.
                    return last;
                }
                last_positive_block = (start, end);
            }
            cum += s;
            start = end;
        }
        let (s, e) = last_positive_block;
        (s..e).rev().find(|&i| self.weight(i) > 0.0).unwrap_or(s)
    }
}

/// The total of a [`Categorical`]'s weights in the crate's fixed order: block sums of [`BLOCK`] entries, in order.
pub fn blocked_total<C: Categorical + ?Sized>(c: &C) -> f64 {
    let n = c.len();
    let mut total = 0.0;
    let mut start = 0;
    while start < n {
        let end = (start + BLOCK).min(n);
        total += c.block_sum(start, end);
        start = end;
    }
    total
}

/// Adds eight lanes in a fixed tree order.
#[inline(always)]
pub(crate) fn reduce_lanes(acc: [f64; 8]) -> f64 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// A source of the random decisions of speculative sampling.
///
/// Implemented for every [`rand::Rng`] (pass `&mut rng`), and by [`crate::enumerate::Enumerator`].
pub trait Chance {
    /// `true` with probability `prob`; callers pass `prob ∈ [0, 1)` (certain events are not drawn).
    fn bernoulli(&mut self, prob: f64) -> bool;
    /// Outcome `i` with probability `weight(i) / total()`; callers guarantee `total() > 0`.
    fn categorical<C: Categorical + ?Sized>(&mut self, dist: &C) -> usize;
}

/// A uniform on [0, 1) with 53 random bits, as `rand`'s standard `f64` distribution draws it.
#[inline]
pub fn unit_uniform<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl<R: Rng + ?Sized> Chance for R {
    #[inline]
    fn bernoulli(&mut self, prob: f64) -> bool {
        unit_uniform(self) < prob
    }

    #[inline]
    fn categorical<C: Categorical + ?Sized>(&mut self, dist: &C) -> usize {
        dist.inverse_cdf(unit_uniform(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain weight vector, for testing the walk.
    struct Plain(Vec<f64>, f64);

    impl Plain {
        fn new(w: Vec<f64>) -> Self {
            let mut p = Plain(w, 0.0);
            p.1 = blocked_total(&p);
            p
        }
    }

    impl Categorical for Plain {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn weight(&self, i: usize) -> f64 {
            self.0[i]
        }
        fn block_sum(&self, start: usize, end: usize) -> f64 {
            let mut acc = [0.0; 8];
            for (k, w) in self.0[start..end].iter().enumerate() {
                acc[k % 8] += w;
            }
            reduce_lanes(acc)
        }
        fn total(&self) -> f64 {
            self.1
        }
    }

    #[test]
    fn inverse_cdf_hits_interval_boundaries() {
        // Weights 1, 0, 3, 0, ..., 4 over 200 entries (several blocks): intervals [0,1), [1,4), [4,8) of total 8.
        let mut w = vec![0.0; 200];
        w[0] = 1.0;
        w[2] = 3.0;
        w[150] = 4.0;
        let d = Plain::new(w);
        assert_eq!(d.total(), 8.0);
        let check = [
            (0.0, 0),
            (0.124, 0),
            (0.125, 2),
            (0.49, 2),
            (0.5, 150),
            (0.999_999, 150),
        ];
        for (u, want) in check {
            assert_eq!(d.inverse_cdf(u), want, "u = {u}");
        }
    }

    #[test]
    fn inverse_cdf_never_returns_zero_weight() {
        let mut w = vec![0.0; 130];
        w[65] = 2.0;
        let d = Plain::new(w);
        for u in [0.0, 0.5, 1.0 - f64::EPSILON, 1.0] {
            assert_eq!(d.inverse_cdf(u), 65);
        }
    }

    #[test]
    fn uniform_is_in_unit_interval() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let u = unit_uniform(&mut rng);
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        assert!((sum / 10_000.0 - 0.5).abs() < 0.02);
    }
}
