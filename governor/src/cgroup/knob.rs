//! The cgroup files the governor writes ("knobs"), how allocations are encoded into them, and how
//! a value read back is compared with the value written.
//!
//! The kernel normalises some writes: `memory.high`/`memory.max` are stored in pages (a value
//! reads back rounded down to the page size), cgroup v1 reports "unlimited" memory as
//! 9223372036854771712 and an unlimited CFS quota as -1, `cpu.max` always reads back as
//! "QUOTA PERIOD". The governor writes values that survive the round trip unchanged (memory
//! rounded *up* to a page, `cpu.max` always with its period), and [`Knob::equivalent`] compares
//! values semantically so that normalisation is never mistaken for someone else's write.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::hierarchy::Controller;

/// A cgroup file the governor writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Knob {
    /// v2 `cpu.max`: "QUOTA PERIOD" in microseconds, QUOTA may be "max".
    #[serde(rename = "cpu.max")]
    CpuMax,
    /// v2 `cpu.weight`: 1..=10000, default 100.
    #[serde(rename = "cpu.weight")]
    CpuWeight,
    /// v1 `cpu.cfs_quota_us`: microseconds per period, -1 = unlimited.
    #[serde(rename = "cpu.cfs_quota_us")]
    CfsQuota,
    /// v1 `cpu.cfs_period_us`: 1000..=1000000 microseconds.
    #[serde(rename = "cpu.cfs_period_us")]
    CfsPeriod,
    /// v1 `cpu.shares`: 2..=262144, default 1024.
    #[serde(rename = "cpu.shares")]
    CpuShares,
    /// v2 `memory.max`: hard limit in bytes or "max" (reaching it triggers the OOM killer).
    #[serde(rename = "memory.max")]
    MemoryMax,
    /// v2 `memory.high`: throttle/reclaim point in bytes or "max" (never kills).
    #[serde(rename = "memory.high")]
    MemoryHigh,
    /// v1 `memory.limit_in_bytes`: hard limit, -1 = unlimited.
    #[serde(rename = "memory.limit_in_bytes")]
    MemoryLimit,
    /// v1 `memory.soft_limit_in_bytes`: reclaim target under global memory pressure only.
    #[serde(rename = "memory.soft_limit_in_bytes")]
    MemorySoftLimit,
}

/// Rate-limit class of a knob (CPU writes are cheap and frequent, memory writes reclaim).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KnobClass {
    Cpu,
    Memory,
}

impl Knob {
    /// Every knob, in the order restores are made: limits loosened before periods and weights,
    /// hard memory limits before soft ones.
    pub const ALL: [Knob; 9] = [
        Knob::CpuMax,
        Knob::CfsQuota,
        Knob::CfsPeriod,
        Knob::CpuWeight,
        Knob::CpuShares,
        Knob::MemoryMax,
        Knob::MemoryLimit,
        Knob::MemoryHigh,
        Knob::MemorySoftLimit,
    ];

    /// The file name inside the cgroup directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Knob::CpuMax => "cpu.max",
            Knob::CpuWeight => "cpu.weight",
            Knob::CfsQuota => "cpu.cfs_quota_us",
            Knob::CfsPeriod => "cpu.cfs_period_us",
            Knob::CpuShares => "cpu.shares",
            Knob::MemoryMax => "memory.max",
            Knob::MemoryHigh => "memory.high",
            Knob::MemoryLimit => "memory.limit_in_bytes",
            Knob::MemorySoftLimit => "memory.soft_limit_in_bytes",
        }
    }

    /// The controller the file belongs to.
    pub fn controller(self) -> Controller {
        match self.class() {
            KnobClass::Cpu => Controller::Cpu,
            KnobClass::Memory => Controller::Memory,
        }
    }

    /// The knob's rate-limit class.
    pub fn class(self) -> KnobClass {
        match self {
            Knob::CpuMax | Knob::CpuWeight | Knob::CfsQuota | Knob::CfsPeriod | Knob::CpuShares => {
                KnobClass::Cpu
            }
            Knob::MemoryMax | Knob::MemoryHigh | Knob::MemoryLimit | Knob::MemorySoftLimit => {
                KnobClass::Memory
            }
        }
    }

    /// Position in [`Knob::ALL`] (restore order).
    pub fn restore_rank(self) -> usize {
        Knob::ALL
            .iter()
            .position(|k| *k == self)
            .unwrap_or(usize::MAX)
    }

    /// True when `a` and `b` mean the same setting once the kernel's normalisation is taken into
    /// account. Values that do not parse are compared as trimmed text.
    pub fn equivalent(self, a: &str, b: &str, page_size: u64) -> bool {
        match (self.parse(a, page_size), self.parse(b, page_size)) {
            (Some(x), Some(y)) => x == y,
            _ => a.trim() == b.trim(),
        }
    }

    fn parse(self, s: &str, page_size: u64) -> Option<Parsed> {
        let s = s.trim();
        match self {
            Knob::CpuMax => parse_cpu_max(s).map(|(quota, period)| Parsed::CpuMax(quota, period)),
            Knob::CpuWeight | Knob::CfsPeriod | Knob::CpuShares => s.parse().ok().map(Parsed::Num),
            Knob::CfsQuota => parse_cfs_quota(s).map(Parsed::Limit),
            Knob::MemoryMax | Knob::MemoryHigh | Knob::MemoryLimit | Knob::MemorySoftLimit => {
                parse_memory_limit(s)
                    .map(|l| Parsed::Limit(l.map(|b| b / page_size.max(1) * page_size.max(1))))
            }
        }
    }
}

impl fmt::Display for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file_name())
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    Num(u64),
    /// `None` = unlimited.
    Limit(Option<u64>),
    CpuMax(Option<u64>, Option<u64>),
}

/// Smallest CFS quota the kernel accepts (1 ms).
pub const MIN_CFS_QUOTA_US: u64 = 1_000;
/// Accepted CFS period range (1 ms ..= 1 s).
pub const CFS_PERIOD_RANGE_US: std::ops::RangeInclusive<u64> = 1_000..=1_000_000;
/// Accepted `cpu.weight` range.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;
/// Accepted `cpu.shares` range (the kernel clamps writes into it).
pub const SHARES_RANGE: std::ops::RangeInclusive<u64> = 2..=262_144;
/// v1 reports at least this for an unlimited memory limit (PAGE_COUNTER_MAX pages); any value
/// this large means "unlimited".
const V1_UNLIMITED_THRESHOLD: u64 = 1 << 62;

/// `cpu.weight` → `cpu.shares`: proportional, the kernel's defaults matched (weight 100, v2's
/// default, is 1024 shares, v1's), as systemd maps `CPUWeight=` to `CPUShares=`; rounded up, so
/// that `shares_to_weight(weight_to_shares(w)) == w` for every weight.
///
/// Why not the OCI runtimes' mapping (`weight = 1 + ((shares - 2) * 9999) / 262142`, under which
/// 1024 shares are weight 39 and weight 100 is 2598 shares; the daemon used it until
/// 2026-11-29): a policy leaves most jobs at weight 100, "hands off", and the daemon then writes
/// nothing, so their groups keep v1's default 1024. Under the runtimes' mapping a job the policy
/// holds back to weight 50 was written 1287 shares, more than its untouched neighbours, and got
/// more CPU instead of less. Only a mapping that sends the default to the default keeps a plan's
/// proportions on v1 what they are on v2.
pub fn weight_to_shares(weight: u32) -> u64 {
    let w = u64::from(weight.clamp(*WEIGHT_RANGE.start(), *WEIGHT_RANGE.end()));
    (w * 1024)
        .div_ceil(100)
        .clamp(*SHARES_RANGE.start(), *SHARES_RANGE.end())
}

/// `cpu.shares` → `cpu.weight` (the inverse of [`weight_to_shares`]: 1024 shares are weight 100).
pub fn shares_to_weight(shares: u64) -> u32 {
    let s = shares.clamp(*SHARES_RANGE.start(), *SHARES_RANGE.end());
    ((s * 100) / 1024).clamp(
        u64::from(*WEIGHT_RANGE.start()),
        u64::from(*WEIGHT_RANGE.end()),
    ) as u32
}

/// A core count as a CFS quota for `period_us`, or `None` for no cap. Non-positive counts get the
/// kernel's minimum quota (1 ms per period); infinity means no cap; the quota is capped at 4096
/// cores' worth. NaN is rejected by the caller before this is reached.
pub fn cores_to_quota(max_cores: Option<f64>, period_us: u64) -> Option<u64> {
    let cores = max_cores?;
    if cores.is_infinite() && cores > 0.0 {
        return None;
    }
    let quota = (cores * period_us as f64).ceil();
    let ceiling = (period_us * 4096) as f64;
    Some(if quota.is_nan() || quota < MIN_CFS_QUOTA_US as f64 {
        MIN_CFS_QUOTA_US
    } else if quota > ceiling {
        ceiling as u64
    } else {
        quota as u64
    })
}

/// Encode a v2 `cpu.max` value ("max PERIOD" or "QUOTA PERIOD").
pub fn encode_cpu_max(quota_us: Option<u64>, period_us: u64) -> String {
    match quota_us {
        Some(q) => format!("{q} {period_us}"),
        None => format!("max {period_us}"),
    }
}

/// Parse `cpu.max`: (`None` for "max" or the quota, the period if present).
pub fn parse_cpu_max(s: &str) -> Option<(Option<u64>, Option<u64>)> {
    let mut fields = s.split_whitespace();
    let quota = match fields.next()? {
        "max" => None,
        q => Some(q.parse().ok()?),
    };
    let period = match fields.next() {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    if fields.next().is_some() {
        return None;
    }
    Some((quota, period))
}

/// Parse `cpu.cfs_quota_us`: `None` for unlimited (any negative value).
pub fn parse_cfs_quota(s: &str) -> Option<Option<u64>> {
    let q: i64 = s.trim().parse().ok()?;
    Some(u64::try_from(q).ok())
}

/// Parse a memory limit in any of its spellings: "max" (v2), "-1" or a huge value (v1) mean
/// unlimited (`Some(None)`); garbage gives `None`.
pub fn parse_memory_limit(s: &str) -> Option<Option<u64>> {
    let s = s.trim();
    if s == "max" {
        return Some(None);
    }
    if let Ok(v) = s.parse::<i64>()
        && v < 0
    {
        return Some(None);
    }
    let v: u64 = s.parse().ok()?;
    Some((v < V1_UNLIMITED_THRESHOLD).then_some(v))
}

/// Encode a memory limit for `knob`: bytes rounded up to a whole page (the kernel stores pages,
/// so the value reads back unchanged), or the knob's spelling of unlimited.
pub fn encode_memory(knob: Knob, bytes: Option<u64>, page_size: u64) -> String {
    match bytes {
        Some(b) => {
            let page = page_size.max(1);
            b.div_ceil(page).saturating_mul(page).to_string()
        }
        None if matches!(knob, Knob::MemoryMax | Knob::MemoryHigh) => "max".to_owned(),
        None => "-1".to_owned(),
    }
}

/// The system's page size (4096 when it cannot be read).
pub fn page_size() -> u64 {
    use nix::unistd::{SysconfVar, sysconf};
    sysconf(SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_to_shares_round_trips_for_every_weight() {
        for w in WEIGHT_RANGE {
            let s = weight_to_shares(w);
            assert!(
                SHARES_RANGE.contains(&s),
                "weight {w} -> shares {s} out of range"
            );
            assert_eq!(shares_to_weight(s), w, "weight {w} -> shares {s}");
        }
    }

    #[test]
    fn weight_to_shares_known_points() {
        // The defaults match: a job left at weight 100 (not written) and one written at 100
        // stand equal on v1 as on v2.
        assert_eq!(weight_to_shares(100), 1024);
        assert_eq!(shares_to_weight(1024), 100);
        // Half the default is half the default.
        assert_eq!(weight_to_shares(50), 512);
        assert_eq!(weight_to_shares(1), 11);
        assert_eq!(weight_to_shares(10_000), 102_400);
        // Out-of-range weights are clamped, never panic.
        assert_eq!(weight_to_shares(0), 11);
        assert_eq!(weight_to_shares(u32::MAX), 102_400);
        assert_eq!(shares_to_weight(0), 1);
        assert_eq!(shares_to_weight(u64::MAX), 10_000);
    }

    #[test]
    fn weight_to_shares_is_monotonic() {
        let mut prev = 0;
        for w in WEIGHT_RANGE {
            let s = weight_to_shares(w);
            assert!(s > prev, "shares not increasing at weight {w}");
            prev = s;
        }
    }

    #[test]
    fn cores_to_quota_covers_caps_and_edge_cases() {
        assert_eq!(cores_to_quota(None, 100_000), None);
        assert_eq!(cores_to_quota(Some(0.2), 100_000), Some(20_000));
        assert_eq!(cores_to_quota(Some(1.5), 100_000), Some(150_000));
        assert_eq!(cores_to_quota(Some(0.0), 100_000), Some(MIN_CFS_QUOTA_US));
        assert_eq!(cores_to_quota(Some(-3.0), 100_000), Some(MIN_CFS_QUOTA_US));
        assert_eq!(cores_to_quota(Some(0.001), 100_000), Some(MIN_CFS_QUOTA_US));
        assert_eq!(cores_to_quota(Some(f64::INFINITY), 100_000), None);
        assert_eq!(
            cores_to_quota(Some(f64::NEG_INFINITY), 100_000),
            Some(MIN_CFS_QUOTA_US)
        );
        assert_eq!(cores_to_quota(Some(1e12), 100_000), Some(409_600_000));
    }

    #[test]
    fn cpu_max_encoding_round_trips() {
        assert_eq!(encode_cpu_max(None, 100_000), "max 100000");
        assert_eq!(encode_cpu_max(Some(20_000), 100_000), "20000 100000");
        assert_eq!(parse_cpu_max("max 100000"), Some((None, Some(100_000))));
        assert_eq!(
            parse_cpu_max("20000 50000\n"),
            Some((Some(20_000), Some(50_000)))
        );
        assert_eq!(parse_cpu_max("max"), Some((None, None)));
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cpu_max("lots 100000"), None);
        assert_eq!(parse_cpu_max("1 2 3"), None);
    }

    #[test]
    fn memory_limits_parse_every_spelling() {
        assert_eq!(parse_memory_limit("max\n"), Some(None));
        assert_eq!(parse_memory_limit("-1"), Some(None));
        assert_eq!(parse_memory_limit("9223372036854771712"), Some(None));
        assert_eq!(parse_memory_limit("67108864"), Some(Some(64 << 20)));
        assert_eq!(parse_memory_limit("0"), Some(Some(0)));
        assert_eq!(parse_memory_limit("64M"), None);
        assert_eq!(parse_memory_limit(""), None);
    }

    #[test]
    fn memory_encoding_rounds_up_to_a_page_and_spells_unlimited_per_version() {
        assert_eq!(encode_memory(Knob::MemoryHigh, Some(1), 4096), "4096");
        assert_eq!(encode_memory(Knob::MemoryMax, Some(8192), 4096), "8192");
        assert_eq!(encode_memory(Knob::MemoryMax, Some(8193), 4096), "12288");
        assert_eq!(encode_memory(Knob::MemoryMax, None, 4096), "max");
        assert_eq!(encode_memory(Knob::MemoryLimit, None, 4096), "-1");
        assert_eq!(encode_memory(Knob::MemorySoftLimit, None, 4096), "-1");
        assert_eq!(
            encode_memory(Knob::MemoryMax, Some(u64::MAX), 4096),
            u64::MAX.to_string(),
            "saturates instead of overflowing"
        );
    }

    #[test]
    fn equivalence_follows_the_kernels_normalisation() {
        let p = 4096;
        // memory: the kernel keeps pages, so an unaligned write reads back rounded down.
        assert!(Knob::MemoryMax.equivalent("100000", "98304", p));
        assert!(!Knob::MemoryMax.equivalent("100000", "94208", p));
        assert!(Knob::MemoryMax.equivalent("max", "max\n", p));
        assert!(!Knob::MemoryMax.equivalent("max", "4096", p));
        // v1 unlimited spellings.
        assert!(Knob::MemoryLimit.equivalent("-1", "9223372036854771712", p));
        assert!(Knob::CfsQuota.equivalent("-1", "-1\n", p));
        assert!(!Knob::CfsQuota.equivalent("-1", "20000", p));
        // cpu.max: the governor always writes the period, and the kernel always reads it back.
        assert!(Knob::CpuMax.equivalent("max 100000", "max 100000\n", p));
        assert!(!Knob::CpuMax.equivalent("max 100000", "max 50000", p));
        assert!(!Knob::CpuMax.equivalent("20000 100000", "max 100000", p));
        assert!(Knob::CpuWeight.equivalent("100", " 100\n", p));
        // Garbage compares as text and never panics.
        assert!(Knob::CpuWeight.equivalent("zzz", "zzz", p));
        assert!(!Knob::CpuWeight.equivalent("zzz", "100", p));
    }

    #[test]
    fn every_knob_has_a_distinct_file_and_a_restore_rank() {
        let mut names: Vec<_> = Knob::ALL.iter().map(|k| k.file_name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Knob::ALL.len());
        for (i, k) in Knob::ALL.iter().enumerate() {
            assert_eq!(k.restore_rank(), i);
        }
        assert!(Knob::CfsQuota.restore_rank() < Knob::CfsPeriod.restore_rank());
        assert!(Knob::MemoryMax.restore_rank() < Knob::MemoryHigh.restore_rank());
    }
}
