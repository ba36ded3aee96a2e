//! The cgroup tree as the eBPF backend sees it (step 4 of the module documentation): the index
//! from ids to directories, walked again when needed, and the totals of removed cgroups kept by
//! their nearest live ancestor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cgroupfs::CgroupIndex;
use super::sys::CgroupHandles;
use super::{CgroupCpuStats, GRAVEYARD_TTL, MIN_WALK_INTERVAL};

/// The cgroup tree as the eBPF backend sees it: ids to directories, the totals removed cgroups
/// left to their ancestors, and the monotonic floor of each group it reported.
pub(super) struct CgroupTree {
    root: PathBuf,
    pub(super) index: CgroupIndex,
    last_walk: Option<Instant>,
    /// Index before the last walk: where removed cgroups were.
    previous: CgroupIndex,
    /// Totals of removed cgroups, held by their nearest live ancestor (holder id -> totals).
    pub(super) retired: HashMap<u64, CgroupCpuStats>,
    /// Removed ids -> (holder of their totals, when removed): late charges follow them.
    graveyard: HashMap<u64, (Option<u64>, Instant)>,
    /// Ids that exist but not under our root (not ours to name or delete) -> when checked.
    foreign: HashMap<u64, Instant>,
    /// Highest figures reported per group id (counters must not go backwards).
    floor: HashMap<u64, CgroupCpuStats>,
    /// Whether a cgroup id exists (`None`: cannot tell); file handles on the real root.
    exists: Box<dyn Fn(u64) -> Option<bool> + Send>,
    walk_error_logged: bool,
    /// Successful walks so far.
    pub(super) walks: u64,
}

/// Foreign ids are checked again this often (they may have been removed meanwhile).
const FOREIGN_RECHECK: Duration = Duration::from_secs(60);

impl CgroupTree {
    pub(super) fn new(root: &Path) -> CgroupTree {
        let handles = CgroupHandles::open(root)
            .map_err(|e| {
                tracing::debug!(error = %e, "cgroup file handles unavailable: entries of cgroups removed before they were indexed cannot be cleaned up")
            })
            .ok();
        CgroupTree::with_existence(root, Box::new(move |id| handles.as_ref()?.exists(id)))
    }

    pub(super) fn with_existence(
        root: &Path,
        exists: Box<dyn Fn(u64) -> Option<bool> + Send>,
    ) -> CgroupTree {
        CgroupTree {
            root: root.to_path_buf(),
            index: CgroupIndex::default(),
            last_walk: None,
            previous: CgroupIndex::default(),
            retired: HashMap::new(),
            graveyard: HashMap::new(),
            foreign: HashMap::new(),
            floor: HashMap::new(),
            exists,
            walk_error_logged: false,
            walks: 0,
        }
    }

    /// Not in the index, not known to be foreign or removed: a walk may tell where it is.
    pub(super) fn is_unknown(&self, id: u64) -> bool {
        !self.index.contains(id)
            && !self.foreign.contains_key(&id)
            && !self.graveyard.contains_key(&id)
    }

    /// Walks the tree again (at most once per [`MIN_WALK_INTERVAL`] unless `force`). Returns
    /// whether it did.
    pub(super) fn refresh(&mut self, force: bool) -> bool {
        let now = Instant::now();
        if !force && self.last_walk.is_some_and(|t| now - t < MIN_WALK_INTERVAL) {
            return false;
        }
        self.last_walk = Some(now);
        match CgroupIndex::walk(&self.root) {
            Ok(index) => {
                self.previous = std::mem::replace(&mut self.index, index);
                self.walk_error_logged = false;
                self.walks += 1;
                true
            }
            Err(e) => {
                if !self.walk_error_logged {
                    tracing::warn!(root = %self.root.display(), error = %e, "cannot walk the cgroup tree");
                    self.walk_error_logged = true;
                }
                false
            }
        }
    }

    /// A walk when a foreign id is due for a new look (they may be gone).
    pub(super) fn recheck_foreign_due(&mut self) -> bool {
        let now = Instant::now();
        if self.foreign.values().any(|&t| now - t > FOREIGN_RECHECK) {
            self.refresh(false)
        } else {
            false
        }
    }

    /// The nearest ancestor of a removed `id` (by the previous index) that is still there.
    fn holder_of(&self, id: u64) -> Option<u64> {
        self.previous
            .ancestry(id)
            .skip(1)
            .find(|&a| self.index.contains(a))
    }

    /// Where the totals of a removed cgroup go when only its parent's id is known (it was created
    /// and removed between two walks): the parent if it is live, else the parent's own holder.
    fn holder_via_parent(&self, parent: Option<u64>) -> Option<u64> {
        let p = parent?;
        if self.index.contains(p) {
            Some(p)
        } else if let Some(&(holder, _)) = self.graveyard.get(&p) {
            holder
        } else {
            self.holder_of(p)
        }
    }

    /// After a walk: finds which map entries belong to removed cgroups, moves their totals to the
    /// nearest live ancestor and returns their ids (to delete from the map). `pending` are the
    /// ids (and parents) of the CPUs' pending charges; `parent_of` gives the parent the program
    /// recorded for an id.
    pub(super) fn reconcile(
        &mut self,
        stats: &HashMap<u64, CgroupCpuStats>,
        pending: &HashMap<u64, u64>,
        parent_of: impl Fn(u64) -> Option<u64>,
    ) -> Vec<u64> {
        let now = Instant::now();
        // Holders that were removed themselves pass their retired totals up.
        let orphaned: Vec<u64> = self
            .retired
            .keys()
            .copied()
            .filter(|&h| !self.index.contains(h))
            .collect();
        for h in orphaned {
            let totals = self.retired.remove(&h).unwrap_or_default();
            if let Some(up) = self.holder_of(h) {
                let e = self.retired.entry(up).or_default();
                *e = e.add(totals);
            }
        }
        for (holder, _) in self.graveyard.values_mut() {
            if let Some(h) = *holder
                && !self.index.contains(h)
            {
                *holder = self
                    .previous
                    .ancestry(h)
                    .skip(1)
                    .find(|&a| self.index.contains(a));
            }
        }
        self.graveyard.retain(|_, (_, t)| now - *t < GRAVEYARD_TTL);
        self.floor.retain(|id, _| self.index.contains(*id));

        let mut gone = Vec::new();
        for (&id, &totals) in stats {
            let Some(holder) = self.classify(id, || parent_of(id), now) else {
                continue;
            };
            if let Some(h) = holder {
                let e = self.retired.entry(h).or_default();
                *e = e.add(totals);
            }
            tracing::debug!(cgroup_id = id, holder = ?holder, "cgroup removed: entry deleted, totals kept by its ancestor");
            gone.push(id);
        }
        // Ids only in the CPUs' pending charges: classified, so that reads count their charges
        // for the holder until they reach the map (and then the entry is deleted as above).
        for (&id, &parent) in pending {
            if !stats.contains_key(&id) {
                self.classify(
                    id,
                    || Some(parent).filter(|&p| p != 0).or_else(|| parent_of(id)),
                    now,
                );
            }
        }
        gone
    }

    /// For an id not in the (fresh) index: `Some(holder)` if its cgroup is gone (recorded in the
    /// graveyard), `None` if it is live or exists outside our root (recorded as foreign).
    fn classify(
        &mut self,
        id: u64,
        parent: impl FnOnce() -> Option<u64>,
        now: Instant,
    ) -> Option<Option<u64>> {
        if self.index.contains(id) {
            return None;
        }
        let holder = if let Some(&(holder, _)) = self.graveyard.get(&id) {
            holder
        } else if self.previous.contains(id) {
            self.holder_of(id)
        } else {
            match (self.exists)(id) {
                Some(false) => self.holder_via_parent(parent()),
                // Exists outside our root, or the kernel will not say: leave it alone.
                _ => {
                    self.foreign.insert(id, now);
                    return None;
                }
            }
        };
        self.foreign.remove(&id);
        self.graveyard.insert(id, (holder, now));
        Some(holder)
    }

    /// Moves the figures of removed cgroups (late or pending charges not yet folded into
    /// `retired`) to the ancestor that holds their totals.
    pub(super) fn redirect_removed(&self, own: &mut HashMap<u64, CgroupCpuStats>) {
        let removed: Vec<(u64, u64)> = own
            .keys()
            .filter(|&&id| !self.index.contains(id))
            .filter_map(|&id| Some((id, self.graveyard.get(&id)?.0?)))
            .collect();
        for (id, holder) in removed {
            if let Some(t) = own.remove(&id) {
                let e = own.entry(holder).or_default();
                *e = e.add(t);
            }
        }
    }

    /// Reports at least what was reported before for this group.
    pub(super) fn apply_floor(&mut self, id: u64, stats: CgroupCpuStats) -> CgroupCpuStats {
        let floor = self.floor.entry(id).or_default();
        let out = CgroupCpuStats {
            on_cpu_ns: stats.on_cpu_ns.max(floor.on_cpu_ns),
            run_queue_wait_ns: stats.run_queue_wait_ns.max(floor.run_queue_wait_ns),
            context_switches: stats.context_switches.max(floor.context_switches),
        };
        *floor = out;
        out
    }
}
