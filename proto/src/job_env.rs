//! The environment a training job carries: the variables by which a process asks to be
//! governed (read by the daemon's discovery, set by `governor run-job`) and those the
//! coordinator and the node's launcher give the jobs they start. One list, so that the side that
//! sets a variable and the side that reads it cannot drift apart.

/// The job's log file(s), globs or log directories (TensorBoard, MLflow), `:`-separated: a
/// process carrying it is a training job to govern.
pub const LOG: &str = "GOVERNOR_LOG";
/// The job's total epochs (a positive number, [`parse_epochs`]): its size, for the policy.
pub const EPOCHS: &str = "GOVERNOR_EPOCHS";
/// The metric that is the job's progress signal (default: its training loss).
pub const METRIC: &str = "GOVERNOR_METRIC";
/// The job's name in `governor status`.
pub const JOB: &str = "GOVERNOR_JOB";
/// The coordinator's id of the job (set by the coordinator).
pub const JOB_ID: &str = "GOVERNOR_JOB_ID";
/// The member's rank among the job's replicas (set by the coordinator).
pub const RANK: &str = "GOVERNOR_RANK";
/// How many replicas the job has (set by the coordinator).
pub const WORLD_SIZE: &str = "GOVERNOR_WORLD_SIZE";
/// The cores the job holds now (set by the coordinator when the job declared cores): an
/// elastic job's current size, to size its workers or threads by (`OMP_NUM_THREADS`,
/// `torch.set_num_threads`).
pub const CORES: &str = "GOVERNOR_CORES";
/// The host of rank 0 (set by the coordinator for multi-member jobs).
pub const MASTER_ADDR: &str = "GOVERNOR_MASTER_ADDR";

/// Opt-in: end the job once it has converged, `PATIENCE[:MIN_DELTA]` (like Keras
/// `EarlyStopping`: PATIENCE values of its validation loss in a row without a new best by more
/// than MIN_DELTA, default 0). The daemon then stops it gracefully (SIGINT, SIGTERM after a
/// grace period) and reports it "stopped: converged".
pub const FINISH: &str = "GOVERNOR_FINISH";

/// Opt-in: the job is a trial of a hyperparameter sweep, `NAME[:ETA:FIRST_RUNG[:seen]]` (e.g.
/// `lr` or `lr:3:5`): the trials of one sweep (on a node for `run-job`, across the cluster for
/// `govctl submit`) are cut by successive halving (at FIRST_RUNG · ETA^k epochs only the best
/// 1/ETA go on, and of the others only those whose predicted final loss is confidently worse;
/// default 3 and 5 epochs; `:seen` ranks by the loss seen at the rung). A trial cut is stopped
/// gracefully (SIGINT, SIGTERM after a grace period) and reported "stopped: outranked in its
/// sweep".
pub const SWEEP: &str = "GOVERNOR_SWEEP";

/// A sweep declaration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a sweep: NAME[:ETA:FIRST_RUNG[:seen]], a name of letters, digits, '.', '_' or '-', a whole ETA >= 2 and a first rung in epochs > 0 (e.g. lr or lr:3:5)"
)]
pub struct InvalidSweep(pub String);

/// Parse `NAME[:ETA:FIRST_RUNG[:seen]]` (the one syntax of `GOVERNOR_SWEEP`, `run-job --sweep`, a job
/// file's `sweep` and `govctl submit --sweep`).
pub fn parse_sweep(s: &str) -> Result<governor_policy::sweep::SweepTrial, InvalidSweep> {
    governor_policy::sweep::SweepTrial::parse(s).ok_or_else(|| InvalidSweep(s.to_owned()))
}

/// The one spelling of a sweep declaration (what `run-job` passes on in `GOVERNOR_SWEEP`).
pub fn format_sweep(t: &governor_policy::sweep::SweepTrial) -> String {
    t.to_string()
}

/// A finish rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a finish rule: PATIENCE[:MIN_DELTA[:predict]], a whole number of values >= 1 and a change >= 0 (e.g. 5:0.001)"
)]
pub struct InvalidFinish(pub String);

/// Parse `PATIENCE[:MIN_DELTA]` (the one syntax of `GOVERNOR_FINISH`, `run-job --finish` and a
/// job file's `finish`).
pub fn parse_finish(s: &str) -> Result<governor_policy::quality::FinishRule, InvalidFinish> {
    governor_policy::quality::FinishRule::parse(s).ok_or_else(|| InvalidFinish(s.to_owned()))
}

/// A number of epochs that is not a positive finite number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a positive number of epochs")]
pub struct InvalidEpochs(pub String);

/// The one validation of a declared epoch count (`--epochs`, `GOVERNOR_EPOCHS`, `epochs =` in a
/// job file): a positive finite number, surrounding blanks ignored.
pub fn parse_epochs(s: &str) -> Result<f64, InvalidEpochs> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|e| valid_epochs(*e))
        .ok_or_else(|| InvalidEpochs(s.to_owned()))
}

/// Whether an epoch count read from elsewhere (TOML) is usable.
pub fn valid_epochs(e: f64) -> bool {
    e.is_finite() && e > 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_rules_parse_patience_and_an_optional_delta() {
        let r = parse_finish("5:0.001").unwrap();
        assert_eq!((r.patience, r.min_delta), (5, 0.001));
        assert_eq!(parse_finish(" 3 ").unwrap().min_delta, 0.0);
        for bad in ["0", "-1", "x", "5:-1", "5:nan", ""] {
            assert!(parse_finish(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sweeps_parse_a_name_and_an_optional_rule() {
        let t = parse_sweep("lr-sweep").unwrap();
        assert_eq!(t.sweep, "lr-sweep");
        assert_eq!(t.rule, governor_policy::sweep::HalvingRule::default());
        let t = parse_sweep(" lr:4:2.5 ").unwrap();
        assert_eq!((t.rule.eta, t.rule.first_rung), (4, 2.5));
        assert_eq!(parse_sweep(&format_sweep(&t)).unwrap(), t);
        let t = parse_sweep("lr:3:5:seen").unwrap();
        assert_eq!(t.rule.ranking, governor_policy::sweep::Ranking::Seen);
        assert_eq!(format_sweep(&t), "lr:3:5:seen");
        assert_eq!(parse_sweep(&format_sweep(&t)).unwrap(), t);
        assert_eq!(
            parse_sweep("lr:3:5:predicted").unwrap().rule,
            governor_policy::sweep::HalvingRule::default()
        );
        for bad in [
            "",
            ":3:5",
            "lr:1:5",
            "lr:3:0",
            "lr:3",
            "lr:3:5:7",
            "lr:3:5:seen:x",
            "lr::seen",
            "lr:x:5",
            "lr:3:nan",
            "a b",
            "lr/x",
            "lr:3:-1",
        ] {
            assert!(parse_sweep(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn epochs_must_be_a_positive_number() {
        assert_eq!(parse_epochs("12"), Ok(12.0));
        assert_eq!(parse_epochs(" 2.5 "), Ok(2.5));
        for bad in ["0", "-3", "NaN", "inf", "many", ""] {
            assert!(parse_epochs(bad).is_err(), "{bad:?}");
        }
    }
}
