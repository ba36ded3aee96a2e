//! The governance logic over an in-memory device (the real NVML path, through the stand-in
//! library, is tested end to end in `tests/tests/gpu_standin.rs`).

use std::sync::{Arc, Mutex};

use super::*;

/// Devices in memory: (snapshot, fail set with this error).
#[derive(Clone, Default)]
struct Fake(
    Arc<Mutex<(Vec<Snapshot>, Option<GpuError>)>>,
    /// Locked clocks by device.
    Arc<Mutex<std::collections::HashMap<u32, u32>>>,
);

impl GpuDevices for Fake {
    fn count(&self) -> Result<u32, GpuError> {
        Ok(self.0.lock().unwrap().0.len() as u32)
    }
    fn snapshot(&self, index: u32) -> Result<Snapshot, GpuError> {
        self.0
            .lock()
            .unwrap()
            .0
            .get(index as usize)
            .cloned()
            .ok_or(GpuError::Other("no such device".into()))
    }
    fn set_power_limit(&self, index: u32, milliwatts: u32) -> Result<(), GpuError> {
        let mut g = self.0.lock().unwrap();
        if let Some(e) = g.1.clone() {
            return Err(e);
        }
        g.0[index as usize].limit_mw = Some(milliwatts);
        Ok(())
    }
    fn lock_clocks(&self, index: u32, mhz: Option<u32>) -> Result<(), GpuError> {
        if let Some(e) = self.0.lock().unwrap().1.clone() {
            return Err(e);
        }
        let mut locked = self.1.lock().unwrap();
        match mhz {
            Some(m) => locked.insert(index, m),
            None => locked.remove(&index),
        };
        Ok(())
    }
}

impl Fake {
    fn limit(&self, index: usize) -> u32 {
        self.0.lock().unwrap().0[index].limit_mw.unwrap()
    }
    fn with(&self, f: impl FnOnce(&mut Vec<Snapshot>)) {
        f(&mut self.0.lock().unwrap().0)
    }
}

fn h100(index: u32, pids: &[(u32, u64)]) -> Snapshot {
    Snapshot {
        index,
        uuid: format!("GPU-{index}"),
        model: "H100".into(),
        utilization_percent: 90,
        memory_used_bytes: 0,
        memory_total_bytes: 80 << 30,
        power_mw: Some(600_000),
        energy_mj: Some(1_000_000),
        limit_mw: Some(700_000),
        default_limit_mw: Some(700_000),
        min_limit_mw: Some(200_000),
        max_limit_mw: Some(700_000),
        max_clock_mhz: Some(1980),
        mig: false,
        processes: pids.to_vec(),
    }
}

/// A /proc with `pid` in cgroup `path` (v2 line).
fn proc_dir(dir: &Path, procs: &[(u32, &str)]) {
    for (pid, path) in procs {
        let d = dir.join(pid.to_string());
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("cgroup"), format!("0::/{path}\n")).unwrap();
    }
}

fn job(name: &str, category: Category) -> GpuJob {
    GpuJob {
        name: name.into(),
        cgroup: format!("governor/{name}"),
        category,
        records: 0,
        last_record_at: None,
    }
}

struct Bed {
    dir: tempfile::TempDir,
    fake: Fake,
}

impl Bed {
    fn new(devices: Vec<Snapshot>) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        proc_dir(
            &dir.path().join("proc"),
            &[
                (100, "governor/a"),
                (101, "governor/b/worker"),
                (102, "other/x"),
            ],
        );
        let fake = Fake::default();
        fake.with(|d| *d = devices);
        Bed { dir, fake }
    }
    fn journal(&self) -> PathBuf {
        self.dir.path().join(JOURNAL_FILE_NAME)
    }
    fn governor(&self, govern: bool) -> GpuGovernor {
        GpuGovernor::new(
            Box::new(self.fake.clone()),
            govern,
            GpuPowerParams::default(),
            self.journal(),
        )
        .with_proc_root(self.dir.path().join("proc"))
    }
}

#[test]
fn jobs_are_found_on_their_gpus_and_share_its_energy_by_memory() {
    let bed = Bed::new(vec![h100(
        0,
        &[(100, 3 << 30), (101, 1 << 30), (102, 1 << 30)],
    )]);
    let mut g = bed.governor(false);
    let jobs = [
        job("a", Category::Progressing),
        job("b", Category::Progressing),
    ];
    g.step(0.0, &jobs);
    bed.fake.with(|d| d[0].energy_mj = Some(1_400_000)); // 400 J more
    g.step(0.0, &jobs);
    assert_eq!(
        g.status()[0].jobs,
        ["a", "b"],
        "pid 102 is no governed job's"
    );
    assert_eq!(g.status()[0].energy_joules, Some(400.0));
    let a = g.job("a").unwrap();
    assert_eq!((a.gpus.clone(), a.memory_bytes), (vec![0], 3 << 30));
    assert!((a.energy_joules - 300.0).abs() < 1e-9, "{a:?}");
    assert!((g.job("b").unwrap().energy_joules - 100.0).abs() < 1e-9);
    // Utilisation (90%) and power (600 W) split the same way: 3/4 to a (the memory of the
    // governed jobs only).
    assert!((a.utilization_percent - 67.5).abs() < 1e-9, "{a:?}");
    assert!((a.power_watts - 450.0).abs() < 1e-9, "{a:?}");
    // Reading only: the limit is never touched.
    assert_eq!(bed.fake.limit(0), 700_000);
    assert!(!bed.journal().exists());
}

#[test]
fn a_converged_job_lowers_its_gpu_which_is_restored_when_it_learns_again_or_leaves() {
    let bed = Bed::new(vec![h100(0, &[(100, 1 << 30)])]);
    let mut g = bed.governor(true);
    g.step(0.0, &[job("a", Category::Progressing)]);
    assert_eq!(bed.fake.limit(0), 700_000);
    assert!(!bed.journal().exists());
    g.step(0.0, &[job("a", Category::Converged)]);
    assert_eq!(bed.fake.limit(0), 420_000);
    let journal = fs::read_to_string(bed.journal()).unwrap();
    assert!(journal.contains("\"original_mw\": 700000"), "{journal}");
    assert_eq!(g.status()[0].original_limit_watts, Some(700.0));
    g.step(0.0, &[job("a", Category::Watching)]);
    assert_eq!(bed.fake.limit(0), 560_000);
    g.step(0.0, &[job("a", Category::Progressing)]);
    assert_eq!(bed.fake.limit(0), 700_000);
    assert!(!bed.journal().exists(), "nothing left to restore");
    g.step(0.0, &[job("a", Category::Converged)]);
    // The job leaves (no governed job on the GPU): back to the original.
    g.step(0.0, &[]);
    assert_eq!(bed.fake.limit(0), 700_000);
    assert!(!bed.journal().exists());
}

#[test]
fn a_limit_changed_by_someone_else_is_adopted_as_the_original() {
    let bed = Bed::new(vec![h100(0, &[(100, 1 << 30)])]);
    let mut g = bed.governor(true);
    g.step(0.0, &[job("a", Category::Converged)]);
    assert_eq!(bed.fake.limit(0), 420_000);
    // `nvidia-smi -pl 500`
    bed.fake.with(|d| d[0].limit_mw = Some(500_000));
    g.step(0.0, &[job("a", Category::Converged)]);
    assert_eq!(bed.fake.limit(0), 300_000, "60% of the adopted 500 W");
    assert_eq!(g.restore_all(), 1);
    assert_eq!(
        bed.fake.limit(0),
        500_000,
        "restored to the operator's value"
    );
}

#[test]
fn the_daemon_stopping_or_crashing_leaves_every_gpu_as_it_found_it() {
    let bed = Bed::new(vec![h100(0, &[(100, 1 << 30)]), h100(1, &[(101, 1 << 30)])]);
    let mut g = bed.governor(true);
    g.step(
        0.0,
        &[job("a", Category::Converged), job("b", Category::Watching)],
    );
    assert_eq!((bed.fake.limit(0), bed.fake.limit(1)), (420_000, 560_000));
    // A crash: nothing restored, the journal stays; the next start restores both.
    drop(g);
    assert!(bed.journal().exists());
    let g = bed.governor(true);
    assert_eq!((bed.fake.limit(0), bed.fake.limit(1)), (700_000, 700_000));
    assert!(!bed.journal().exists());
    drop(g);
    // A clean stop restores too.
    let mut g = bed.governor(true);
    g.step(0.0, &[job("a", Category::Converged)]);
    assert_eq!(g.restore_all(), 1);
    assert_eq!(bed.fake.limit(0), 700_000);
}

#[test]
fn a_gpu_that_refuses_is_reported_once_and_no_longer_governed() {
    let bed = Bed::new(vec![h100(0, &[(100, 1 << 30)])]);
    bed.fake.0.lock().unwrap().1 = Some(GpuError::NoPermission);
    let mut g = bed.governor(true);
    g.step(0.0, &[job("a", Category::Converged)]);
    assert_eq!(bed.fake.limit(0), 700_000);
    assert!(
        !bed.journal().exists(),
        "nothing was changed, nothing to restore"
    );
    let note = g.status()[0].note.clone().unwrap();
    assert!(note.contains("no permission"), "{note}");
    // It is not tried again.
    bed.fake.0.lock().unwrap().1 = None;
    g.step(0.0, &[job("a", Category::Converged)]);
    assert_eq!(bed.fake.limit(0), 700_000);
}

#[test]
fn mig_devices_are_read_and_left_alone() {
    let mut mig = h100(0, &[(100, 1 << 30)]);
    mig.mig = true;
    let bed = Bed::new(vec![mig]);
    let mut g = bed.governor(true);
    g.step(0.0, &[job("a", Category::Converged)]);
    assert_eq!(bed.fake.limit(0), 700_000);
    assert!(g.status()[0].note.as_deref().unwrap().contains("MIG"));
    assert_eq!(g.status()[0].jobs, ["a"]);
}

#[test]
fn the_search_lowers_a_lone_stopped_job_as_far_as_its_pace_allows() {
    let bed = Bed::new(vec![h100(0, &[(100, 1 << 30)])]);
    let mut g = bed.governor(true).with_search(0.02);
    // The fake's pace does not depend on the limit: one record a second whatever it is.
    let mut seen = Vec::new();
    for t in 0..200u64 {
        let mut a = job("a", Category::Converged);
        a.records = t;
        a.last_record_at = Some(t as f64);
        g.step(t as f64, &[a]);
        let l = bed.fake.limit(0);
        if seen.last() != Some(&l) {
            seen.push(l);
        }
    }
    assert_eq!(seen.first(), Some(&700_000));
    assert_eq!(seen.last(), Some(&200_000), "{seen:?}");
    assert!(seen.windows(2).all(|w| w[1] < w[0]), "only down: {seen:?}");
    // Learning again: back to the original, nothing left to restore.
    g.step(300.0, &[job("a", Category::Progressing)]);
    assert_eq!(bed.fake.limit(0), 700_000);
    assert!(!bed.journal().exists());
}

#[test]
fn without_a_pace_the_fixed_fractions_apply() {
    let bed = Bed::new(vec![h100(0, &[(100, 1 << 30)])]);
    let mut g = bed.governor(true).with_search(0.02);
    g.step(0.0, &[job("a", Category::Converged)]);
    assert_eq!(bed.fake.limit(0), 420_000, "no record time: 60% at once");
}

#[test]
fn locked_clocks_follow_the_stage_and_are_unlocked_on_restore() {
    let bed = Bed::new(vec![h100(0, &[(100, 1 << 30)])]);
    let locked = |f: &Fake| f.1.lock().unwrap().get(&0).copied();
    let mut g = bed.governor(true).with_mechanism(Mechanism::Clocks);
    g.step(0.0, &[job("a", Category::Progressing)]);
    assert_eq!(locked(&bed.fake), None);
    g.step(1.0, &[job("a", Category::Converged)]);
    assert_eq!(locked(&bed.fake), Some(1188), "60% of 1980 MHz");
    assert_eq!(bed.fake.limit(0), 700_000, "the power limit is left alone");
    assert!(
        fs::read_to_string(bed.journal())
            .unwrap()
            .contains("\"locked_mhz\": 1188")
    );
    // A crash, then the next start unlocks.
    drop(g);
    let g = bed.governor(true).with_mechanism(Mechanism::Clocks);
    assert_eq!(locked(&bed.fake), None);
    assert!(!bed.journal().exists());
    drop(g);
    let mut g = bed.governor(true).with_mechanism(Mechanism::Clocks);
    g.step(0.0, &[job("a", Category::Watching)]);
    assert_eq!(locked(&bed.fake), Some(1584), "80%");
    g.step(1.0, &[job("a", Category::Progressing)]);
    assert_eq!(locked(&bed.fake), None);
    assert!(!bed.journal().exists());
}
