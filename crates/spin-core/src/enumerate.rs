//! Exact outcome distributions by enumerating every random branch of the real samplers.
//!
//! [`Enumerator`] is a [`Chance`] that, instead of drawing, follows a script of branch choices and multiplies the
//! branch probabilities; [`enumerate`] re-runs a closure once per path of the decision tree (depth-first, like an
//! odometer) and returns each path's result with its exact probability. Because the closure calls the same
//! `verify`, `judge_batch` and `correct` functions a random generator would drive, this checks the implementation,
//! not a re-derivation of it. The cost is the number of paths, so it is meant for small vocabularies and drafts.

use crate::chance::{Categorical, Chance};

/// A [`Chance`] that replays scripted branch choices and tracks the path probability.
#[derive(Debug, Clone, Default)]
pub struct Enumerator {
    script: Vec<usize>,
    arity: Vec<usize>,
    depth: usize,
    prob: f64,
}

impl Enumerator {
    fn choose(&mut self, arity: usize) -> usize {
        let c = if self.depth < self.script.len() {
            self.script[self.depth]
        } else {
            self.script.push(0);
            self.arity.push(arity);
            0
        };
        self.depth += 1;
        c
    }

    /// The probability of the path taken so far.
    pub fn path_probability(&self) -> f64 {
        self.prob
    }

    /// Moves the script to the next unexplored path; `false` when the tree is exhausted.
    fn advance(&mut self) -> bool {
        self.script.truncate(self.depth);
        self.arity.truncate(self.depth);
        while let Some(last) = self.script.pop() {
            let n = self.arity.pop().unwrap_or(0);
            if last + 1 < n {
                self.script.push(last + 1);
                self.arity.push(n);
                return true;
            }
        }
        false
    }
}

impl Chance for Enumerator {
    fn bernoulli(&mut self, prob: f64) -> bool {
        if prob <= 0.0 {
            return false;
        }
        // Branch 0: the event happens.
        if self.choose(2) == 0 {
            self.prob *= prob;
            true
        } else {
            self.prob *= 1.0 - prob;
            false
        }
    }

    fn categorical<C: Categorical + ?Sized>(&mut self, dist: &C) -> usize {
        // Only outcomes of positive weight are branches: a sampler never returns the others.
        let support: Vec<usize> = (0..dist.len()).filter(|&i| dist.weight(i) > 0.0).collect();
        let i = support[self.choose(support.len())];
        self.prob *= dist.weight(i) / dist.total();
        i
    }
}

/// Runs `f` once per path of its decision tree and returns every result with the probability of its path.
///
/// Zero-probability branches are not explored. Results are not merged; group them as the test needs.
///
/// ```
/// use spin_core::Dist;
/// use spin_core::enumerate::enumerate;
///
/// let w = [1.0f64, 0.0, 3.0];
/// let d = Dist::new(&w)?;
/// let paths = enumerate(|e| d.sample(e));
/// assert_eq!(paths, vec![(0, 0.25), (2, 0.75)]);
/// # Ok::<(), spin_core::CoreError>(())
/// ```
pub fn enumerate<T, F: FnMut(&mut Enumerator) -> T>(mut f: F) -> Vec<(T, f64)> {
    let mut e = Enumerator::default();
    let mut out = Vec::new();
    loop {
        e.depth = 0;
        e.prob = 1.0;
        let t = f(&mut e);
        if e.prob > 0.0 {
            out.push((t, e.prob));
        }
        if !e.advance() {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_coins_enumerate_four_paths() {
        let paths = enumerate(|e| (e.bernoulli(0.25), e.bernoulli(0.5)));
        assert_eq!(paths.len(), 4);
        let total: f64 = paths.iter().map(|p| p.1).sum();
        assert_eq!(total, 1.0);
        assert!(paths.contains(&((true, true), 0.125)));
        assert!(paths.contains(&((false, false), 0.375)));
    }

    #[test]
    fn data_dependent_depth() {
        // A second coin only after the first comes up true: three paths.
        let paths = enumerate(|e| {
            if e.bernoulli(0.5) {
                Some(e.bernoulli(0.5))
            } else {
                None
            }
        });
        assert_eq!(paths.len(), 3);
        assert!(paths.contains(&(None, 0.5)));
    }
}
