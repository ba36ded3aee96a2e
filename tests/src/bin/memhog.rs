//! `memhog MIB [HOLD_SECS]`: allocate and touch MIB mebibytes, then hold them (used by memory tests).
use std::time::Duration;

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .expect("usage: memhog MIB [HOLD_SECS]");
    let hold: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let mut chunks = Vec::with_capacity(mib);
    for _ in 0..mib {
        // Touch every page so the memory is really charged to the cgroup.
        chunks.push(vec![1u8; 1 << 20]);
    }
    println!("allocated {mib} MiB");
    std::thread::sleep(Duration::from_secs(hold));
    std::hint::black_box(&chunks);
}
