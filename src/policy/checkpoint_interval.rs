//! How often to checkpoint: the interval that maximises the expected share of
//! productive time, given the checkpoint cost δ and the mean time to failure M
//! (exponential failures).
//!
//! Young's first-order rule is `τ = √(2δM)`; Daly's higher-order form
//! (`τ = √(2δM)·(1 + ⅓√(δ/2M) + ⅑·δ/2M) − δ` for δ < 2M, else M) stays close
//! to the true optimum when δ is not small against M, where Young's overshoots
//! (by 33% at δ = M/3). The advice is Daly's; `tests` checks it against a
//! simulated failure trace.

use serde::Serialize;

/// Young's interval (seconds of work between checkpoints).
pub fn young(delta: f64, mtbf: f64) -> f64 {
    (2.0 * delta * mtbf).sqrt()
}

/// Daly's higher-order interval.
pub fn daly(delta: f64, mtbf: f64) -> f64 {
    if delta >= 2.0 * mtbf {
        return mtbf;
    }
    let x = delta / (2.0 * mtbf);
    (2.0 * delta * mtbf).sqrt() * (1.0 + x.sqrt() / 3.0 + x / 9.0) - delta
}

/// Expected share of wall time that is saved work, checkpointing every `tau`
/// seconds of work at cost `delta`, with exponential failures of mean `mtbf`
/// and `restart` seconds lost to each restart (Daly's model).
pub fn expected_ettr(tau: f64, delta: f64, mtbf: f64, restart: f64) -> f64 {
    if tau <= 0.0 || mtbf <= 0.0 {
        return 0.0;
    }
    tau / (mtbf * (restart / mtbf).exp() * (((tau + delta) / mtbf).exp() - 1.0))
}

/// The advice for one job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Advice {
    pub checkpoint_cost_s: f64,
    pub mtbf_s: f64,
    pub restart_s: f64,
    pub young_s: f64,
    pub optimal_s: f64,
    pub ettr_at_optimal: f64,
    /// The job's current interval and the ETTR it gives, when known.
    pub current_s: Option<f64>,
    pub ettr_at_current: Option<f64>,
}

/// Advise from measured cost, failure rate and (optionally) the current interval.
pub fn advise(delta: f64, mtbf: f64, restart: f64, current: Option<f64>) -> Option<Advice> {
    if !(delta > 0.0 && mtbf > 0.0 && delta.is_finite() && mtbf.is_finite()) {
        return None;
    }
    let opt = daly(delta, mtbf);
    Some(Advice {
        checkpoint_cost_s: delta,
        mtbf_s: mtbf,
        restart_s: restart,
        young_s: young(delta, mtbf),
        optimal_s: opt,
        ettr_at_optimal: expected_ettr(opt, delta, mtbf, restart),
        current_s: current,
        ettr_at_current: current.map(|c| expected_ettr(c, delta, mtbf, restart)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64: a fixed, dependency-free stream of uniform numbers.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        fn exp(&mut self, mean: f64) -> f64 {
            -mean * self.next().ln()
        }
    }

    /// Simulated ETTR of a failure trace: between failures, only whole
    /// (work + checkpoint) segments survive; the rest is lost.
    fn simulated_ettr(gaps: &[f64], tau: f64, delta: f64) -> f64 {
        let saved: f64 = gaps.iter().map(|x| (x / (tau + delta)).floor() * tau).sum();
        saved / gaps.iter().sum::<f64>()
    }

    #[test]
    fn advice_is_within_5_percent_of_the_simulated_optimum() {
        for (delta, mtbf) in [
            (60.0, 3600.0),
            (300.0, 3600.0),
            (30.0, 86_400.0),
            (600.0, 1800.0),
            (10.0, 600.0),
        ] {
            let mut rng = Rng(42);
            let gaps: Vec<f64> = (0..100_000).map(|_| rng.exp(mtbf)).collect();
            let y = young(delta, mtbf);
            // Scan a log grid from 0.2x to 3x Young's interval, same trace for all.
            let (lo, hi) = (0.2 * y, 3.0 * y);
            let (best_tau, _) = (0..=300)
                .map(|i| lo * (hi / lo).powf(i as f64 / 300.0))
                .map(|t| (t, simulated_ettr(&gaps, t, delta)))
                .fold((0.0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
            let advised = advise(delta, mtbf, 0.0, None).unwrap().optimal_s;
            let off = (advised / best_tau - 1.0).abs();
            assert!(off < 0.05, "delta {delta} mtbf {mtbf}: advised {advised:.0}, simulated optimum {best_tau:.0} ({:.1}%)", off * 100.0);
        }
    }

    #[test]
    fn young_overshoots_when_the_cost_is_large() {
        assert!((young(600.0, 1800.0) / daly(600.0, 1800.0)) > 1.25);
        assert_eq!(daly(5000.0, 1800.0), 1800.0);
        let a = advise(60.0, 3600.0, 30.0, Some(3600.0)).unwrap();
        assert!(a.ettr_at_optimal > a.ettr_at_current.unwrap());
        assert!(advise(0.0, 3600.0, 0.0, None).is_none());
    }
}
