//! The environment a training job carries: the variables by which a process asks to be
//! governed (read by the daemon's discovery, set by `governor run-job`) and those the
//! coordinator and the node's launcher give the jobs they start. One list, so that the side that
//! sets a variable and the side that reads it cannot drift apart.

/// The job's log file(s), `:`-separated: a process carrying it is a training job to govern.
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
/// The host of rank 0 (set by the coordinator for multi-member jobs).
pub const MASTER_ADDR: &str = "GOVERNOR_MASTER_ADDR";

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
    fn epochs_must_be_a_positive_number() {
        assert_eq!(parse_epochs("12"), Ok(12.0));
        assert_eq!(parse_epochs(" 2.5 "), Ok(2.5));
        for bad in ["0", "-3", "NaN", "inf", "many", ""] {
            assert!(parse_epochs(bad).is_err(), "{bad:?}");
        }
    }
}
