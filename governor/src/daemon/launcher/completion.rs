//! The completion witness: a job moved to this node that ends on its own (exit 0, not a save)
//! leaves a record of it in its shared checkpoint directory, so that the coordinator, should it
//! not have heard of the end (this node cut off), does not run the job again when it gives the
//! move up and starts the job on its source from that directory.
//!
//! Why the record is always there in time: a job the coordinator may start elsewhere is one
//! moved here whose move is not done; this node fences it (asks it to save) once nothing it sent
//! has been acknowledged for the bound, and it is gone by 1.75 x the bound
//! ([`super::fence::fence_timings`]); an end before then is recorded when this node sees it
//! (milliseconds later). The coordinator starts the job on its source only after twice the
//! bound ([`governor_planner::StateConfig::fence_after_s`]), and that start reads the record
//! first. A job that saved when fenced (or for a move) leaves none: its start elsewhere resumes
//! it. Written only for jobs that run as root (the daemon writes as root into the directory the
//! submission names) and that declared a shared directory (a carried checkpoint is not seen by
//! the source).

use std::path::Path;

use tracing::{info, warn};

/// The record's file, in the job's checkpoint directory.
pub(crate) const FILE: &str = ".governor-completed";

/// Record that `job_id` ended on its own at `attempt` (a failure is only logged: without the
/// record the coordinator may run the rest of the job again, never two copies at once).
pub(crate) fn record(dir: &Path, job_id: &str, attempt: u32) {
    let path = dir.join(FILE);
    match crate::sys::durable::write_durably(&path, format!("{job_id} {attempt}\n").as_bytes()) {
        Ok(()) => {
            info!(job = %job_id, attempt, path = %path.display(), "a moved job ended on its own: recorded beside its checkpoint")
        }
        Err(e) => {
            warn!(job = %job_id, attempt, path = %path.display(), error = %e, "cannot record beside its checkpoint that a moved job ended on its own")
        }
    }
}

/// The attempt at which `job_id` ended on its own, as recorded in `dir`; `None` when no record
/// is there or it is another job's (the directory reused by a later submission).
pub(crate) fn recorded(dir: &Path, job_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join(FILE)).ok()?;
    let mut fields = text.split_whitespace();
    (fields.next()? == job_id)
        .then(|| fields.next()?.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_its_job_and_attempt() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recorded(dir.path(), "j7"), None);
        record(dir.path(), "j7", 2);
        assert_eq!(recorded(dir.path(), "j7"), Some(2));
        assert_eq!(recorded(dir.path(), "j8"), None, "another job's record");
        std::fs::write(dir.path().join(FILE), "j7 two\n").unwrap();
        assert_eq!(recorded(dir.path(), "j7"), None, "a damaged record");
    }
}
