//! The launcher's journal: the coordinator's running jobs, written durably beside the
//! daemon's state file so that a restarted daemon knows them ([`super::recovery`]).

use std::path::PathBuf;

use super::Launcher;
use crate::control::AdoptJob;

/// What the journal keeps of a running job: enough to report it under its coordinator id and
/// govern it again after a restart of the daemon.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct JournalEntry {
    pub(super) job_id: String,
    pub(super) replica: u32,
    pub(super) name: String,
    pub(super) gpu_indices: Vec<u32>,
    pub(super) message: String,
    pub(super) adopt: AdoptJob,
    pub(super) maximise: bool,
    pub(super) priority: i32,
    /// The main process's start ([`crate::sys::process_start_ticks`]): a pid reused by another
    /// process is not taken for the job.
    pub(super) start_ticks: Option<u64>,
    /// Where its supervisor records how it ended ([`crate::supervise::ExitRecord`]).
    #[serde(default)]
    pub(super) exit_file: Option<PathBuf>,
    /// Which start of the job this is (the coordinator's attempt number).
    #[serde(default)]
    pub(super) attempt: u32,
    /// The signal that asks it to save for a move, if it declared a checkpoint.
    #[serde(default)]
    pub(super) save_signal: Option<i32>,
    /// Where CRIU dumps it for a transparent move, when it runs in its own PID namespace.
    #[serde(default)]
    pub(super) bundle: Option<PathBuf>,
    /// Its log's directory (a transparent move carries the files it writes below it).
    #[serde(default)]
    pub(super) log_dir: Option<PathBuf>,
    /// Its declared checkpoint directory (where a save must leave something new).
    #[serde(default)]
    pub(super) checkpoint_dir: Option<PathBuf>,
    /// The user it runs as, whose rights its logs are read with (`None`: root).
    #[serde(default)]
    pub(super) owner: Option<crate::watch::FileOwner>,
    /// Where an end on its own is recorded ([`super::completion`]): a moved job's shared
    /// checkpoint directory, so that a daemon restarted during the move still records it.
    #[serde(default)]
    pub(super) completion_witness: Option<PathBuf>,
}

/// The journal file's content.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Journal {
    pub(super) version: u32,
    pub(super) jobs: Vec<JournalEntry>,
}

pub(super) const JOURNAL_VERSION: u32 = 1;

/// The journal's file name, in the directory of the daemon's state file.
pub const JOURNAL_FILE_NAME: &str = "coordinator-jobs.json";

impl Launcher {
    /// Write the running jobs to the journal (durably: a crash leaves the old or the new
    /// file, and a power cut loses no write that returned). A failure is logged once; the jobs run on, only a restart would not know them.
    pub(super) fn persist(&mut self) {
        self.persist_with(None);
    }

    /// [`Self::persist`], with `starting` recorded too: a start about to spawn its process
    /// (pid 0 in its entry). Written before the spawn, so that a daemon killed between the spawn
    /// and the journal's next write finds the job in its cgroup on restart
    /// ([`super::recovery`]) instead of forgetting a job that runs.
    pub(super) fn persist_with(&mut self, starting: Option<&JournalEntry>) {
        let Some(path) = self.config.journal.clone() else {
            return;
        };
        let journal = Journal {
            version: JOURNAL_VERSION,
            jobs: self
                .jobs
                .values()
                .filter(|l| !l.info.state.is_finished())
                .filter_map(|l| l.record.clone())
                .chain(starting.cloned())
                .collect(),
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let text = serde_json::to_vec_pretty(&journal).map_err(std::io::Error::other)?;
            crate::sys::durable::write_durably(&path, &text)
        };
        match write() {
            Ok(()) => {
                self.logged.remove("journal");
            }
            Err(e) => self.warn_once(
                "journal".into(),
                &format!(
                    "cannot record the coordinator's jobs in {}: {e}; a restarted daemon would report them as local jobs",
                    path.display()
                ),
            ),
        }
    }
}
