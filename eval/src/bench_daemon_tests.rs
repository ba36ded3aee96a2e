use super::*;

#[test]
fn splitmix_is_uniform_enough_and_reproducible() {
    let mut a = SplitMix64(1);
    let mut b = SplitMix64(1);
    let xs: Vec<f64> = (0..10_000).map(|_| a.unit()).collect();
    assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    assert_eq!(b.unit(), xs[0], "same seed, same sequence");
}

#[test]
fn proc_stat_cpu_time_is_parsed_after_the_command_name() {
    // Our own process: the command name cannot confuse the parser, and time only grows.
    let pid = std::process::id();
    let t0 = cpu_seconds(pid).unwrap();
    let mut x = 0u64;
    for i in 0..20_000_000u64 {
        x = x.wrapping_add(i * i);
    }
    std::hint::black_box(x);
    let t1 = cpu_seconds(pid).unwrap();
    assert!(t1 >= t0, "cpu time went backwards: {t0} -> {t1}");
    let (rss, hwm) = memory_kib(pid).unwrap();
    assert!(rss > 0 && hwm >= rss, "rss {rss} KiB, hwm {hwm} KiB");
}
