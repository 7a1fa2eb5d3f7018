//! Confidence intervals of Monte-Carlo means: the Student-t 95 % half-width over independent realisations, the
//! interval every figure draws around a simulated point.

use statrs::distribution::{ContinuousCDF, StudentsT};

/// The 95 % two-sided Student-t half-width of the mean of `values` (independent realisations): t(0.975, n−1)·s/√n.
/// `None` for fewer than two values (no spread to estimate).
pub fn ci95(values: &[f64]) -> Option<f64> {
    let n = values.len();
    if n < 2 {
        return None;
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let t = StudentsT::new(0.0, 1.0, (n - 1) as f64).ok()?.inverse_cdf(0.975);
    Some(t * (var / n as f64).sqrt())
}

/// The means of consecutive chunks of `chunk` values (the per-realisation means of values stored realisation by
/// realisation).
pub fn chunk_means(values: &[f64], chunk: usize) -> Vec<f64> {
    values
        .chunks(chunk.max(1))
        .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the textbook value: t(0.975, 4) = 2.776445, s = √2.5 for 1..=5, half-width 2.776445·√(2.5/5).
    #[test]
    fn student_t_half_width() {
        let h = ci95(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert!((h - 2.776_445 * 0.5f64.sqrt()).abs() < 1e-5, "{h}");
        assert_eq!(ci95(&[3.0]), None);
        assert_eq!(ci95(&[2.0, 2.0, 2.0]), Some(0.0));
        assert_eq!(chunk_means(&[1.0, 3.0, 5.0, 7.0], 2), vec![2.0, 6.0]);
    }
}
