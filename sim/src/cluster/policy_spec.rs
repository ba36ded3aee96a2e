//! What a run is made of: a node policy, a placement policy and the switches between them
//! ([`PolicySpec`], parsed from `NODE[/PLACEMENT][+FLAG...]`), and the minimum run times before
//! a resize or a preemption.

use serde::{Deserialize, Serialize};

use governor_policy::spec::{SpecText, SpecTextError};

use governor_placement::by_name as placement_by_name;

/// A node policy, a placement policy and the switches between them.
///
/// Written in the one policy grammar ([`SpecText`]), `NODE[/PLACEMENT][+FLAG...]`: `NODE` is a
/// node policy spec ([`governor_policy::by_spec`], e.g. `flowcon:interval=30`), `PLACEMENT` a
/// placement policy ([`placement_by_name`]); flags are `+no-move` (ignore the nodes' move
/// requests; `+no-migrate` is its old name), `+move` and `+reserve` (requests reserve the job's
/// parallelism in cores: no sharing), and those of the fields below. Without a
/// placement, each node policy comes with its paper's placement, and a few names stand for whole
/// systems:
///
/// | name | node policy | placement | |
/// | --- | --- | --- | --- |
/// | `fair` | fair | spread | the papers' default schedulers |
/// | `learning-first` | learning-first | spread | the default node policy |
/// | `flowcon` | flowcon | flowcon | FlowCon, Algorithms 1-4 |
/// | `specon` | specon | specon | SpeCon, Algorithms 1-2, moves on |
/// | `procon` | fair | procon | ProCon (placement only) |
/// | `fifo` | fair | first-fit +reserve | Schedulearn FIFO |
/// | `ours` | learning-first (the daemon's default) | soonest | ours |
/// | `shortest-left` (old name `governor`) | shortest-left | soonest | ours until 2026-11-29 |
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicySpec {
    /// The spec as written (the name results are reported under).
    pub name: String,
    pub node: String,
    pub placement: String,
    pub allow_moves: bool,
    pub reserve_cores: bool,
    /// SpeCon's Algorithm 3 (`+rebalance`): after every departure and every round of
    /// Algorithm 2, move recently converged jobs toward idle or underloaded workers.
    #[serde(default)]
    pub rebalance: bool,
    /// Ours (`+pays`): a move Algorithm 2 or 3 chooses is made only if it gives back twice its
    /// downtime in core-seconds ([`governor_placement::payoff`], the coordinator's own gate).
    #[serde(default)]
    pub pays: bool,
    /// Preemption without loss (`+preempt`): a job that fits nowhere displaces lower-priority
    /// ones by checkpoint (the coordinator's rule).
    #[serde(default)]
    pub preempt: bool,
    /// Elastic jobs (`+elastic`, with `+reserve`): jobs that declare a least size
    /// ([`crate::trace::TraceJob::min_cores`]) are admitted at it and grown and shrunk as the
    /// placement policy says ([`governor_placement::elastic`], the coordinator's rule); each
    /// resize stops the job and starts it again at the new size after its save and restore.
    #[serde(default)]
    pub elastic: bool,
    /// Jobs that declare a least size run at it and are never resized (`+least`: FIFO without
    /// elasticity, each job at the size it is sure to get); without it and without `+elastic`
    /// they run at their parallelism (the most they can use).
    #[serde(default)]
    pub least: bool,
    /// A job saved for a resize or a move starts again from scratch (`+scratch`): its work and
    /// its log start over, no checkpoint is restored. Schedulearn's elastic FIFO as written:
    /// "the job will be restarted from the beginning, meaning previously trained weights will
    /// be lost" (the coordinator never does this: it resumes every saved job).
    #[serde(default)]
    pub scratch: bool,
    /// GPU power by training progress (`+gpu-power`, the daemon's `[gpu] govern`): a GPU job's
    /// limit follows its learning stage ([`governor_policy::gpu_power`]), its speed and draw
    /// follow the limit ([`crate::gpu::GpuModel`]).
    #[serde(default)]
    pub gpu_power: bool,
    /// With `+gpu-power`: the fixed fractions only, no search (`+gpu-fixed`).
    #[serde(default)]
    pub gpu_fixed: bool,
}

/// An elastic job is resized only after running this long since its latest start: the
/// coordinator's `resize_min_run_s` default, one constant for both.
pub use governor_placement::elastic::MIN_RUN_S as RESIZE_MIN_RUN_S;

/// A job is displaced only after running this long since its latest start: the coordinator's
/// `preempt_min_run_s` default, one constant for both.
pub use governor_placement::preempt::MIN_RUN_S as PREEMPT_MIN_RUN_S;

impl std::str::FromStr for PolicySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let text: SpecText = s.parse().map_err(|e: SpecTextError| e.to_string())?;
        let head = text.node.as_str();
        let (node, placement, mut reserve) = match &text.placement {
            Some(p) => (head.to_owned(), p.clone(), false),
            None => {
                let (node, placement, reserve) = match governor_policy::canonical_name(
                    text.node_name(),
                ) {
                    "fair" => (head, "spread", false),
                    // The default node policy: fair sharing but for learnt jobs, with fair's
                    // placement, so a comparison with `fair` is the node policy's alone.
                    "learning-first" => (head, "spread", false),
                    // The default scheduler as the papers' explanations describe it: kernel
                    // sharing on the node, placement by instant resource usage.
                    "default" => ("fair", "usage", false),
                    "flowcon" => (head, "flowcon", false),
                    "specon" => (head, "specon", false),
                    "shortest-left" => (head, "soonest", false),
                    "ours" => (governor_policy::DEFAULT_POLICY, "soonest", false),
                    "procon" => ("fair", "procon", false),
                    "fifo" | "schedulearn" => ("fair", "first-fit", true),
                    other => {
                        return Err(format!(
                            "{other:?} is neither a node policy ({}) nor one of ours, procon, fifo; \
                             write NODE/PLACEMENT to choose a placement",
                            governor_policy::POLICY_NAMES.join(", ")
                        ));
                    }
                };
                (node.to_owned(), placement.to_owned(), reserve)
            }
        };
        let mut allow_moves = true;
        let mut rebalance = false;
        let mut pays = false;
        let mut preempt = false;
        let mut elastic = false;
        let mut least = false;
        let mut scratch = false;
        let mut gpu_power = false;
        let mut gpu_fixed = false;
        for (flag, value) in &text.flags {
            if let Some(v) = value {
                return Err(format!(
                    "+{flag}={v} in {s:?}: govsim's flags take no value"
                ));
            }
            match flag.as_str() {
                "move" | "migrate" => allow_moves = true,
                "no-move" | "no-migrate" => allow_moves = false,
                "reserve" => reserve = true,
                "rebalance" => rebalance = true,
                "pays" => pays = true,
                "preempt" => preempt = true,
                "elastic" => elastic = true,
                "least" => least = true,
                "scratch" => scratch = true,
                "gpu-power" => gpu_power = true,
                "gpu-fixed" => {
                    gpu_power = true;
                    gpu_fixed = true;
                }
                f => {
                    return Err(format!(
                        "unknown flag +{f} in {s:?} (move, no-move, reserve, rebalance, pays, preempt, elastic, least, scratch, gpu-power, gpu-fixed)"
                    ));
                }
            }
        }
        governor_policy::by_spec(&node).map_err(|e| format!("{s:?}: {e}"))?;
        placement_by_name(&placement).map_err(|e| format!("{s:?}: {e}"))?;
        Ok(PolicySpec {
            name: s.trim().to_owned(),
            node,
            placement,
            allow_moves,
            reserve_cores: reserve,
            rebalance,
            pays,
            preempt,
            elastic,
            least,
            scratch,
            gpu_power,
            gpu_fixed,
        })
    }
}
