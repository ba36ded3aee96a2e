//! Arbitrary bytes through format detection and every parser: no panic; the same records
//! whether the bytes arrive at once or in appends; a writer cut off early yields a prefix of
//! the whole file's records; fixed formats and the signal tracker never panic either.
//!
//! `cargo +nightly fuzz run parse_log` (from the repository root).
#![no_main]

use std::path::Path;
use std::time::SystemTime;

use governor_progress::{
    Format, FormatChoice, LogStream, Record, SignalConfig, parse_bytes, summarize,
};
use libfuzzer_sys::fuzz_target;

/// A record as comparable data (NaN equal to NaN, no wall time).
fn key(r: &Record) -> (u64, Option<u64>, Option<u64>, &'static str, Vec<(String, u64)>) {
    (
        r.index,
        r.epoch.map(f64::to_bits),
        r.step,
        r.split.as_str(),
        r.metrics
            .iter()
            .map(|(k, v)| (k.to_owned(), if v.is_nan() { u64::MAX } else { v.to_bits() }))
            .collect(),
    )
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, bytes)) = data.split_first() else {
        return;
    };
    let whole = parse_bytes(bytes, FormatChoice::Auto, SystemTime::UNIX_EPOCH);
    let whole_keys: Vec<_> = whole
        .as_ref()
        .map(|log| log.records.iter().map(key).collect())
        .unwrap_or_default();
    if let Ok(log) = &whole {
        let _ = summarize(log, &SignalConfig::default());
    }

    // The same bytes in appends of 1..=64 bytes.
    let chunk = usize::from(ctl % 64) + 1;
    let mut s = LogStream::new(Path::new("fuzz"), FormatChoice::Auto, None).unwrap();
    let mut out = Vec::new();
    let cut = bytes.len() * usize::from(ctl) / 255;
    let mut partial_len = None;
    for (i, piece) in bytes.chunks(chunk).enumerate() {
        if partial_len.is_none() && i * chunk >= cut {
            partial_len = Some(out.len());
        }
        s.push(piece, SystemTime::UNIX_EPOCH, &mut out);
    }
    s.finish(SystemTime::UNIX_EPOCH, &mut out);
    let streamed: Vec<_> = out.iter().map(key).collect();
    assert_eq!(streamed, whole_keys, "appends of {chunk} bytes parse differently");

    // A writer cut off at `cut`: what it produced is where the whole file starts.
    let mut s = LogStream::new(Path::new("fuzz"), FormatChoice::Auto, None).unwrap();
    let mut early = Vec::new();
    s.push(&bytes[..cut], SystemTime::UNIX_EPOCH, &mut early);
    let early: Vec<_> = early.iter().map(key).collect();
    assert!(
        early.len() <= whole_keys.len() && early[..] == whole_keys[..early.len()],
        "a writer cut at {cut} produced records the whole file does not start with"
    );

    // Every format forced on arbitrary bytes.
    let format = Format::ALL[usize::from(ctl) % (Format::ALL.len() - 1)];
    if let Ok(log) = parse_bytes(bytes, FormatChoice::Fixed(format), SystemTime::UNIX_EPOCH) {
        let _ = summarize(
            &log,
            &SignalConfig {
                metric: Some("loss".into()),
                direction: None,
            },
        );
    }
});
