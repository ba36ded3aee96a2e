//! What any order of CPU shares could gain on one node: the jobs of a workload in a fluid model
//! (each job progresses at the cores it is given, up to the cores it can use; nothing is lost to
//! contention, and the kernel delivers every plan whole), under fair sharing, under the best
//! order we know of with perfect knowledge, and under a relaxation that no schedule can beat.
//!
//! Why: a goal for an order of CPU shares (say, average time to quality 30% below fair) may be
//! out of reach of every order. The real runs and the calibrated simulator measure what our orders reach; this says what the
//! *best* order could reach on the same jobs, so that a goal out of reach of every order is
//! known as such instead of being chased with one more order.
//!
//! - [`Order::Fair`]: every runnable job its equal share, capped at its usable cores, the rest
//!   water-filled (processor sharing: what the kernel does with equal weights).
//! - [`Order::Oracle`]: knowing each job's size and when it reaches its quality point, serve the
//!   jobs with the least CPU left to their target first, each at the cores it can use (for
//!   [`Target::Quality`], work past a job's quality point comes after every job still short of
//!   its own). Least-remaining-first is optimal on one core; on several, with per-job limits, it
//!   is the best order we know of, not a proven optimum.
//! - [`Order::Relaxed`]: the same order on one machine as fast as all the cores together, every
//!   job able to use all of them. Any schedule of the real node is a schedule of that machine,
//!   and least-remaining-first is optimal there (with arrivals and preemption), so its average
//!   is a lower bound on every order's. (With quiet phases, when a job cannot run, it is the
//!   same order's result, no longer a proven bound.)

use governor_policy::Direction;
use governor_policy::quality::time_to_quality;
use governor_policy::share::fair_shares;

use crate::job::{JobModel, LossCurve, QuietPhase};

/// What a job needs, in the fluid model.
#[derive(Clone, Debug, PartialEq)]
pub struct FluidJob {
    pub id: String,
    /// Arrival, seconds.
    pub submit: f64,
    /// CPU-seconds to its end.
    pub work: f64,
    /// CPU-seconds to its quality point (at most `work`).
    pub quality_work: f64,
    /// The most cores it can use.
    pub cores: f64,
    pub quiet: Vec<QuietPhase>,
}

impl FluidJob {
    /// A job model's needs: its quality point is the first logged value within 5% of its total
    /// reduction, as govsim and the benchmark judge it, at the CPU-seconds where that value is
    /// logged (after its start-up).
    pub fn from_model(m: &JobModel) -> FluidJob {
        let samples: Vec<(f64, f64)> = match &m.loss {
            LossCurve::Points { points } => points.clone(),
            curve => (1..=100)
                .map(|k| {
                    let x = f64::from(k) / 100.0;
                    (x, curve.value(x))
                })
                .collect(),
        };
        let fraction = time_to_quality(&samples, Direction::Minimise).unwrap_or(1.0);
        let startup = m.startup.clamp(0.0, m.work);
        FluidJob {
            id: m.id.clone(),
            submit: m.submit,
            work: m.work,
            quality_work: startup + fraction.clamp(0.0, 1.0) * (m.work - startup),
            cores: m.parallelism.max(0.01),
            quiet: m.quiet.clone(),
        }
    }
}

/// What an order serves first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Each job's quality point (average time to quality).
    Quality,
    /// Each job's end (average JCT).
    End,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Fair,
    Oracle(Target),
    Relaxed(Target),
}

/// Per job, seconds from its arrival: when it reached its quality point and its end.
#[derive(Clone, Debug, PartialEq)]
pub struct FluidRun {
    pub ttq: Vec<f64>,
    pub jct: Vec<f64>,
}

impl FluidRun {
    pub fn avg_ttq(&self) -> f64 {
        self.ttq.iter().sum::<f64>() / self.ttq.len().max(1) as f64
    }
    pub fn avg_jct(&self) -> f64 {
        self.jct.iter().sum::<f64>() / self.jct.len().max(1) as f64
    }
}

/// Time step of the fluid model, seconds (the jobs here run for tens of seconds).
const STEP: f64 = 0.005;

/// Run `jobs` on a node of `cores` under `order`, the kernel delivering the fraction
/// `delivered` of each plan and the rest as fair sharing would (how the calibrated simulator
/// models the real kernel, [`crate::node::NodeConfig::enforcement`]; 1: the whole plan).
pub fn run(jobs: &[FluidJob], cores: f64, order: Order, delivered: f64) -> FluidRun {
    let delivered = delivered.clamp(0.0, 1.0);
    let n = jobs.len();
    let mut done = vec![0.0f64; n];
    let mut ttq = vec![f64::NAN; n];
    let mut jct = vec![f64::NAN; n];
    let mut next_quiet = vec![0usize; n];
    let mut asleep_until = vec![f64::NEG_INFINITY; n];
    let mut t = 0.0;
    // Past every arrival and every job's whole work at the slowest rate, with its pauses.
    let horizon = jobs.iter().map(|j| j.submit).fold(0.0, f64::max)
        + jobs
            .iter()
            .map(|j| j.work / j.cores.min(cores) + j.quiet.iter().map(|q| q.seconds).sum::<f64>())
            .sum::<f64>()
        + 1.0;
    while jct.iter().any(|x| x.is_nan()) && t < horizon {
        let runnable: Vec<usize> = (0..n)
            .filter(|&i| jobs[i].submit <= t && jct[i].is_nan() && asleep_until[i] <= t)
            .collect();
        let cap = |i: usize| match order {
            Order::Relaxed(_) => cores,
            _ => jobs[i].cores.min(cores),
        };
        // Fair sharing: the kernel's division at equal weights, each job up to its cap.
        let demands: Vec<f64> = runnable.iter().map(|&i| cap(i)).collect();
        let mut fair = vec![0.0f64; n];
        for (&i, share) in runnable.iter().zip(fair_shares(cores, &demands)) {
            fair[i] = share;
        }
        let mut rate = fair.clone();
        match order {
            Order::Fair => {}
            Order::Oracle(target) | Order::Relaxed(target) => {
                let key = |i: usize| {
                    let to_quality = jobs[i].quality_work - done[i];
                    match target {
                        Target::Quality if to_quality > 0.0 => (0, to_quality),
                        Target::Quality => (1, jobs[i].work - done[i]),
                        Target::End => (0, jobs[i].work - done[i]),
                    }
                };
                let mut ranked = runnable.clone();
                ranked.sort_by(|&a, &b| {
                    let (ka, kb) = (key(a), key(b));
                    ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(a.cmp(&b))
                });
                let mut left = cores;
                for i in ranked {
                    let planned = cap(i).min(left);
                    left -= planned;
                    rate[i] = delivered * planned + (1.0 - delivered) * fair[i];
                }
            }
        }
        t += STEP;
        for &i in &runnable {
            let job = &jobs[i];
            done[i] += rate[i] * STEP;
            if ttq[i].is_nan() && done[i] >= job.quality_work - 1e-9 {
                ttq[i] = t - job.submit;
            }
            if done[i] >= job.work - 1e-9 {
                jct[i] = t - job.submit;
            } else if let Some(q) = job.quiet.get(next_quiet[i])
                && done[i] >= q.after
            {
                asleep_until[i] = t + q.seconds;
                next_quiet[i] += 1;
            }
        }
    }
    FluidRun { ttq, jct }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, submit: f64, work: f64, quality_work: f64, cores: f64) -> FluidJob {
        FluidJob {
            id: id.into(),
            submit,
            work,
            quality_work,
            cores,
            quiet: Vec::new(),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 0.05
    }

    #[test]
    fn serving_alike_jobs_in_turns_gains_a_quarter_with_twice_as_many_jobs_as_cores() {
        // Four jobs of 10 CPU-s, each at most one core, on two: fair ends them all at 20 s
        // and brings them to quality (3 CPU-s) at 6 s; in pairs, quality at 3 s and 6 s.
        let jobs: Vec<FluidJob> = (0..4)
            .map(|k| job(&format!("j{k}"), 0.0, 10.0, 3.0, 1.0))
            .collect();
        let fair = run(&jobs, 2.0, Order::Fair, 1.0);
        assert!(fair.jct.iter().all(|&x| close(x, 20.0)), "{fair:?}");
        assert!(fair.ttq.iter().all(|&x| close(x, 6.0)), "{fair:?}");
        let oracle = run(&jobs, 2.0, Order::Oracle(Target::Quality), 1.0);
        assert!(close(oracle.avg_ttq(), 4.5), "{oracle:?}");
        assert!(close(oracle.avg_ttq() / fair.avg_ttq(), 0.75));
        let by_end = run(&jobs, 2.0, Order::Oracle(Target::End), 1.0);
        assert!(close(by_end.avg_jct(), 15.0), "{by_end:?}");
        // On one machine of both cores, one job at a time: quality at 1.5, 3, 4.5, 6 s.
        let relaxed = run(&jobs, 2.0, Order::Relaxed(Target::Quality), 1.0);
        assert!(close(relaxed.avg_ttq(), 3.75), "{relaxed:?}");
    }

    #[test]
    fn the_relaxation_is_below_the_oracle_and_fair_and_caps_and_arrivals_hold() {
        let jobs = vec![
            job("big", 0.0, 40.0, 10.0, 1.7),
            job("small", 5.0, 8.0, 6.0, 1.0),
            job("late", 12.0, 20.0, 4.0, 1.0),
            job("mid", 2.0, 15.0, 12.0, 1.0),
        ];
        let fair = run(&jobs, 2.0, Order::Fair, 1.0);
        for target in [Target::Quality, Target::End] {
            let oracle = run(&jobs, 2.0, Order::Oracle(target), 1.0);
            let relaxed = run(&jobs, 2.0, Order::Relaxed(target), 1.0);
            // A kernel that delivers part of the plan: between the order and fair sharing.
            let none = run(&jobs, 2.0, Order::Oracle(target), 0.0);
            let part = run(&jobs, 2.0, Order::Oracle(target), 0.4);
            let avg = |r: &FluidRun| match target {
                Target::Quality => r.avg_ttq(),
                Target::End => r.avg_jct(),
            };
            assert!(avg(&relaxed) <= avg(&oracle) + 1e-6, "{target:?}");
            assert!(avg(&oracle) <= avg(&fair) + 1e-6, "{target:?}");
            assert!((avg(&none) - avg(&fair)).abs() < 1e-6, "{target:?}");
            assert!(
                avg(&oracle) < avg(&part) && avg(&part) < avg(&fair),
                "{target:?}"
            );
        }
        // No job ends sooner than its work at the cores it can use.
        for (i, j) in jobs.iter().enumerate() {
            assert!(fair.jct[i] >= j.work / j.cores - 0.01, "{}", j.id);
            assert!(fair.ttq[i] <= fair.jct[i]);
        }
    }

    #[test]
    fn a_quiet_phase_takes_no_cpu_and_the_others_get_it() {
        let mut sleeper = job("sleeper", 0.0, 4.0, 4.0, 1.0);
        sleeper.quiet = vec![QuietPhase {
            after: 1.0,
            seconds: 5.0,
        }];
        let jobs = vec![sleeper, job("busy", 0.0, 10.0, 10.0, 2.0)];
        let fair = run(&jobs, 2.0, Order::Fair, 1.0);
        // 1 CPU-s at one core, 5 s asleep, 3 CPU-s at one core: 9 s.
        assert!(close(fair.jct[0], 9.0), "{fair:?}");
        // busy: one core for 1 s, then both while the sleeper sleeps: 9 CPU-s in 4.5 s.
        assert!(close(fair.jct[1], 5.5), "{fair:?}");
    }

    #[test]
    fn a_models_quality_point_is_where_its_curve_is_within_five_percent() {
        let m = JobModel {
            id: "m".into(),
            submit: 3.0,
            work: 26.0,
            parallelism: 1.0,
            speedup: crate::job::Speedup::Linear,
            // Reduction 10 -> 0: within 0.5 first at the third of four epochs.
            loss: LossCurve::Points {
                points: vec![(0.25, 10.0), (0.5, 2.0), (0.75, 0.4), (1.0, 0.0)],
            },
            noise: 0.0,
            log_every: crate::job::LogEvery::Work { fraction: 0.25 },
            reports_total: true,
            memory_bytes: 0,
            priority: 0,
            startup: 6.0,
            quiet: Vec::new(),
            finish: None,
            sweep: None,
        };
        let f = FluidJob::from_model(&m);
        assert!(close(f.quality_work, 6.0 + 0.75 * 20.0), "{f:?}");
        assert_eq!((f.submit, f.work, f.cores), (3.0, 26.0, 1.0));
    }
}
