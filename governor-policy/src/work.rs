//! What a policy knows of a job's size: the fraction of its work done (from its log's
//! "epoch k/N" or its declared epochs) against the CPU it had spent, at its first and latest
//! reports. Shared by the policies that rank or weigh jobs by the work they have left.

/// The fraction of its work a job's reports must span before its remaining work is estimated.
pub(crate) const MIN_SPAN: f64 = 0.05;

/// (fraction done, CPU-seconds) at a job's first and latest reports.
#[derive(Clone, Debug, Default)]
pub(crate) struct Work {
    pub(crate) first: Option<(f64, f64)>,
    pub(crate) last: Option<(f64, f64)>,
}

impl Work {
    /// A report: `fraction` (finite, > 0; capped at 1) of its work done at `cpu` CPU-seconds.
    /// Returns true when its counters went back: a new run of the job, measured afresh from
    /// this report.
    pub(crate) fn report(&mut self, fraction: f64, cpu: f64) -> bool {
        let f = fraction.min(1.0);
        let restarted = self.last.is_some_and(|(last, _)| f < last - 1e-9);
        if restarted {
            self.first = None;
        }
        self.first.get_or_insert((f, cpu));
        self.last = Some((f, cpu));
        restarted
    }

    /// CPU-seconds left, from the CPU spent per fraction of the work since the first report
    /// (the start-up before it, imports and data, is not work that repeats). `None` until the
    /// reports span [`MIN_SPAN`] of the work: one report alone would count the start-up as
    /// work and overestimate a young job several times over.
    pub(crate) fn remaining(&self) -> Option<f64> {
        let (f1, c1) = self.last?;
        let (f0, c0) = self.first?;
        if f1 >= 1.0 {
            return Some(0.0);
        }
        if f1 - f0 < MIN_SPAN || c1 <= c0 {
            return None;
        }
        Some((1.0 - f1).max(0.0) * (c1 - c0) / (f1 - f0))
    }

    /// The fraction done at the latest report.
    pub(crate) fn done(&self) -> Option<f64> {
        self.last.map(|(f, _)| f)
    }
}
