//! A run's counts, by case: what both conformance runners (native and in the browser) print
//! as their closing line, `N cases: P passed, F failed, R refused`, with `P + F + R = N`.

/// What one case came to over the backends it ran on: ordered so that the worst wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Every backend it ran on was within tolerance.
    Pass,
    /// Not run, or not run on some backend (an op or attribute the reader does not
    /// implement, f64 on a device without `SHADER_F64`), and nothing failed.
    Refused,
    /// A backend was outside tolerance or returned an error, or the file did not parse.
    Fail,
}

/// Counts of a conformance run, one per case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Cases (vector files) read.
    pub cases: usize,
    /// Cases that passed on every backend.
    pub passed: usize,
    /// Cases that failed on some backend, or did not parse.
    pub failed: usize,
    /// Cases refused, whole or on some backend, with nothing failed.
    pub refused: usize,
}

impl Tally {
    /// Counts one case.
    pub fn add(&mut self, verdict: Verdict) {
        self.cases += 1;
        match verdict {
            Verdict::Pass => self.passed += 1,
            Verdict::Refused => self.refused += 1,
            Verdict::Fail => self.failed += 1,
        }
    }

    /// `N cases: P passed, F failed, R refused`.
    pub fn closing_line(&self) -> String {
        format!(
            "{} cases: {} passed, {} failed, {} refused",
            self.cases, self.passed, self.failed, self.refused
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_case_counts_once_as_its_worst_backend() {
        let mut tally = Tally::default();
        for verdict in [Verdict::Pass, Verdict::Pass.max(Verdict::Fail), Verdict::Refused.max(Verdict::Pass)]
        {
            tally.add(verdict);
        }
        assert_eq!(tally, Tally { cases: 3, passed: 1, failed: 1, refused: 1 });
        assert_eq!(tally.closing_line(), "3 cases: 1 passed, 1 failed, 1 refused");
    }
}
