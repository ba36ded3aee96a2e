//! The lenient JSON reader on arbitrary bytes: no panic, no stack overflow.
//!
//! `cargo +nightly fuzz run json_object`
#![no_main]

use governor_progress::json::{scan_array_of_objects, scan_object};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut path = String::new();
    let mut n = 0usize;
    let _ = scan_object(data, &mut path, &mut |_, _| n += 1);
    let _ = scan_array_of_objects(data, "log_history", &mut |_, _, _| n += 1);
});
