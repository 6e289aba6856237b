//! The learner's least-squares fits: exponentially forgetting sums of the routing features
//! against one observed time, solved on demand.

/// Forgetting per observation: the fit remembers about the last 2048 first tokens.
pub(super) const FORGET: f64 = 1.0 - 1.0 / 2048.0;
/// Standard errors taken off the decode fit's slope: a decode stall counts only as far as the
/// observations show it beyond their noise (decode times vary with output lengths the router
/// does not know).
const EVIDENCE_SDS: f64 = 2.0;

/// An exponentially forgetting least-squares fit of one time against the routing features.
#[derive(Debug, Default)]
pub(super) struct Fit {
    /// Σ w·x·xᵀ, Σ w·x·y and Σ w·y², w decaying by [`FORGET`].
    pub(super) xx: [[f64; 4]; 4],
    pub(super) xy: [f64; 4],
    pub(super) yy: f64,
}

impl Fit {
    /// Adds one observation `y` of the features `x`.
    pub(super) fn add(&mut self, x: &[f64; 4], y: f64) {
        for (i, row) in self.xx.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = *cell * FORGET + x[i] * x[j];
            }
            self.xy[i] = self.xy[i] * FORGET + x[i] * y;
        }
        self.yy = self.yy * FORGET + y * y;
    }

    /// Coefficient `i` less [`EVIDENCE_SDS`] standard errors, at least zero: the part of a
    /// slope the observations show beyond their noise.
    pub(super) fn evident_slope(&self, i: usize) -> Option<f64> {
        let beta = self.solve()?;
        let count = self.xx[0][0];
        if count <= 8.0 {
            return None;
        }
        let explained: f64 = beta.iter().zip(&self.xy).map(|(b, xy)| b * xy).sum();
        let variance = ((self.yy - explained) / (count - 4.0)).max(0.0);
        let mut unit = [0.0; 4];
        unit[i] = 1.0;
        let spread = solve(&self.xx, &unit)?[i].max(0.0);
        Some((beta[i] - EVIDENCE_SDS * (variance * spread).sqrt()).max(0.0))
    }

    /// The forgetting mean of the fitted time (the first feature is the constant 1).
    pub(super) fn mean(&self) -> f64 {
        if self.xx[0][0] > 0.0 {
            self.xy[0] / self.xx[0][0]
        } else {
            0.0
        }
    }

    /// The fitted coefficients.
    pub(super) fn solve(&self) -> Option<[f64; 4]> {
        solve(&self.xx, &self.xy)
    }
}

/// Solves `(xx + λI) β = xy` for the 4 coefficients by Gaussian elimination with partial
/// pivoting; a small ridge `λ` keeps an unobserved direction (no queued prefill yet) at zero.
fn solve(xx: &[[f64; 4]; 4], xy: &[f64; 4]) -> Option<[f64; 4]> {
    let trace: f64 = (0..4).map(|i| xx[i][i]).sum();
    if !(trace.is_finite() && trace > 0.0) {
        return None;
    }
    // Not on the intercept: a ridge there would shift the mean time onto the slopes.
    let ridge = trace * 1e-12;
    let mut m = [[0.0; 5]; 4];
    for i in 0..4 {
        m[i][..4].copy_from_slice(&xx[i]);
        if i > 0 {
            m[i][i] += ridge;
        }
        m[i][4] = xy[i];
    }
    for col in 0..4 {
        let pivot = (col..4).max_by(|&r, &s| m[r][col].abs().total_cmp(&m[s][col].abs()))?;
        if m[pivot][col].abs() < f64::MIN_POSITIVE {
            return None;
        }
        m.swap(col, pivot);
        for row in 0..4 {
            if row != col {
                let pivot_row = m[col];
                let factor = m[row][col] / pivot_row[col];
                for (cell, p) in m[row][col..].iter_mut().zip(&pivot_row[col..]) {
                    *cell -= factor * p;
                }
            }
        }
    }
    let beta = [
        m[0][4] / m[0][0],
        m[1][4] / m[1][1],
        m[2][4] / m[2][2],
        m[3][4] / m[3][3],
    ];
    beta.iter().all(|b| b.is_finite()).then_some(beta)
}
