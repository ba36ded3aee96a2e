//! `memhog MIB [HOLD_SECS [STEP_MIB STEP_MS]]`: allocate and touch MIB mebibytes, then hold them
//! HOLD_SECS seconds (used by memory tests). With STEP_MIB and STEP_MS the memory grows slowly:
//! STEP_MIB at a time with STEP_MS milliseconds between steps, as a training job's does.
use std::time::Duration;

fn main() {
    let usage = "usage: memhog MIB [HOLD_SECS [STEP_MIB STEP_MS]]";
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .unwrap_or_else(|_| panic!("{usage}: {a:?} is not a number"))
        })
        .collect();
    let mib = *args.first().expect(usage) as usize;
    let hold = args.get(1).copied().unwrap_or(0);
    let step = args.get(2).copied().unwrap_or(mib as u64).max(1) as usize;
    let pause = Duration::from_millis(args.get(3).copied().unwrap_or(0));
    let mut chunks = Vec::with_capacity(mib);
    while chunks.len() < mib {
        for _ in 0..step.min(mib - chunks.len()) {
            // Touch every page so the memory is really charged to the cgroup.
            chunks.push(vec![1u8; 1 << 20]);
        }
        if chunks.len() < mib {
            std::thread::sleep(pause);
        }
    }
    println!("allocated {mib} MiB");
    std::thread::sleep(Duration::from_secs(hold));
    std::hint::black_box(&chunks);
}
