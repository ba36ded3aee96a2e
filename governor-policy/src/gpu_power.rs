//! GPU power by training progress: the power limit a GPU should run at, given the learning
//! stage of the jobs on it.
//!
//! A job that is still learning runs its GPU at the limit the GPU had before the governor
//! touched it (its *original*, normally the device default): slowing it would delay its time to
//! quality. A job whose learning slowed down (watching) or stopped (converged) gains little from
//! each further step, so its GPU runs at a fraction of the original: the energy of the steps
//! after convergence is where Zeus (15-76%) and EnvPipe (25% at under 1% slowdown) find their
//! savings. A GPU shared by several jobs follows its most demanding one. The limit never goes
//! below the device's minimum nor above the original (so never above the default either).
//!
//! Zeus learns each job's throughput against its power limit and picks the lowest limit within
//! a slowdown budget; that needs the job's steps per second from its log and is not built yet:
//! these fractions are the fixed reading of "lower power once converged".

use crate::Category;

/// Fractions of the original limit by stage (`[gpu] watching_power`, `converged_power`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuPowerParams {
    pub watching: f64,
    pub converged: f64,
}

impl Default for GpuPowerParams {
    fn default() -> Self {
        GpuPowerParams {
            watching: 0.8,
            converged: 0.6,
        }
    }
}

/// A GPU's power range, milliwatts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerRange {
    /// The device's lowest settable limit.
    pub min_mw: u32,
    /// Its default limit.
    pub default_mw: u32,
    /// The limit before the governor's first change (what it restores).
    pub original_mw: u32,
}

/// The limit for a GPU whose governed jobs are at `stages`; `None` when it has none (it goes
/// back to its original).
pub fn target_limit(range: PowerRange, stages: &[Category], params: GpuPowerParams) -> Option<u32> {
    let top = range.original_mw.min(range.default_mw).max(range.min_mw);
    let per_job = |c: &Category| -> f64 {
        let f = match c {
            Category::Unknown | Category::Progressing => 1.0,
            Category::Watching => params.watching,
            Category::Converged => params.converged,
        };
        f.clamp(0.0, 1.0) * f64::from(top)
    };
    let wanted = stages
        .iter()
        .map(per_job)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))?;
    Some((wanted.round() as u32).clamp(range.min_mw.min(top), top))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: PowerRange = PowerRange {
        min_mw: 200_000,
        default_mw: 700_000,
        original_mw: 700_000,
    };

    #[test]
    fn learning_jobs_keep_the_original_and_converged_ones_lower_it() {
        let p = GpuPowerParams::default();
        assert_eq!(
            target_limit(H100, &[Category::Progressing], p),
            Some(700_000)
        );
        assert_eq!(target_limit(H100, &[Category::Unknown], p), Some(700_000));
        assert_eq!(target_limit(H100, &[Category::Watching], p), Some(560_000));
        assert_eq!(target_limit(H100, &[Category::Converged], p), Some(420_000));
        assert_eq!(target_limit(H100, &[], p), None);
    }

    #[test]
    fn a_shared_gpu_follows_its_most_demanding_job() {
        let p = GpuPowerParams::default();
        let stages = [Category::Converged, Category::Progressing];
        assert_eq!(target_limit(H100, &stages, p), Some(700_000));
        let stages = [Category::Converged, Category::Watching];
        assert_eq!(target_limit(H100, &stages, p), Some(560_000));
    }

    #[test]
    fn never_below_the_minimum_nor_above_the_original_or_default() {
        let p = GpuPowerParams {
            watching: 0.1,
            converged: 0.0,
        };
        assert_eq!(target_limit(H100, &[Category::Converged], p), Some(200_000));
        let lowered_by_admin = PowerRange {
            original_mw: 500_000,
            ..H100
        };
        let up = GpuPowerParams {
            watching: 2.0,
            converged: 2.0,
        };
        assert_eq!(
            target_limit(lowered_by_admin, &[Category::Converged], up),
            Some(500_000)
        );
        let above_default = PowerRange {
            original_mw: 800_000,
            ..H100
        };
        assert_eq!(
            target_limit(above_default, &[Category::Progressing], p),
            Some(700_000)
        );
    }
}
