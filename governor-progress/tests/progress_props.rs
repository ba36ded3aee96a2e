//! Properties of progress parsing on arbitrary input: no panic, the same records however the
//! bytes are split into appends, a writer cut off mid-file never produces a record the whole
//! file would not, and no record carries a value that is not in the input.

mod common;

use std::path::Path;
use std::time::SystemTime;

use common::{Seen, seen};
use governor_progress::{FormatChoice, LogStream, Record, parse_bytes};
use proptest::prelude::*;

/// Feeds `bytes` in pieces cut at `cuts` (positions, any order, out-of-range ignored);
/// `finish` when the writer is done.
fn stream(bytes: &[u8], cuts: &[usize], finish: bool) -> Vec<Record> {
    let mut s = LogStream::new(Path::new("prop"), FormatChoice::Auto, None).unwrap();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    let mut at = 0;
    for p in points.into_iter().chain([bytes.len()]) {
        s.push(&bytes[at..p], SystemTime::UNIX_EPOCH, &mut out);
        at = p;
    }
    if finish {
        s.finish(SystemTime::UNIX_EPOCH, &mut out);
    }
    out
}

fn batch(bytes: &[u8]) -> Vec<Seen> {
    parse_bytes(bytes, FormatChoice::Auto, SystemTime::UNIX_EPOCH)
        .map(|log| seen(&log.records))
        .unwrap_or_default()
}

/// Lines of several real formats (each with the numbers it writes), garbage lines without
/// digits, and random line endings. Returns the bytes and every number written.
fn log_lines() -> impl Strategy<Value = (Vec<u8>, Vec<f64>)> {
    let line = prop_oneof![
        (0u32..1000, 1u32..100_000).prop_map(|(i, l)| {
            let loss = format!("{}.{l:05}", i % 9);
            (
                format!("iter {i}: loss {loss}, time 12.5ms, mfu 0.01%"),
                vec![i as f64, loss.parse().unwrap(), 12.5, 0.01],
            )
        }),
        (0u32..100, 1u32..100_000).prop_map(|(i, l)| {
            let loss = format!("0.{l:05}");
            (
                format!("{{'loss': {loss}, 'grad_norm': 1.5, 'epoch': {i}.5}}"),
                vec![loss.parse().unwrap(), 1.5, i as f64 + 0.5],
            )
        }),
        (0u32..100, 1u32..100_000).prop_map(|(i, l)| {
            let loss = format!("1.{l:05}");
            (
                format!("Epoch [{i}/100], Step [{i}/600], Loss: {loss}"),
                vec![i as f64, 100.0, 600.0, loss.parse().unwrap()],
            )
        }),
        (0u32..100, 1u32..100_000).prop_map(|(i, l)| {
            let loss = format!("2.{l:05}");
            (
                format!("{{\"iteration\": {i}, \"total_loss\": {loss}, \"lr\": 1e-05}}"),
                vec![i as f64, loss.parse().unwrap(), 1e-05],
            )
        }),
        (0u32..100, 1u32..100_000).prop_map(|(i, l)| {
            let loss = format!("3.{l:05}");
            (
                format!("{i},{loss},0.5"),
                vec![i as f64, loss.parse().unwrap(), 0.5],
            )
        }),
        Just(("epoch,loss,accuracy".to_owned(), vec![])),
        // Garbage: anything but digits and line terminators.
        proptest::collection::vec(any::<u8>(), 0..80).prop_map(|mut v| {
            v.retain(|b| !b.is_ascii_digit() && *b != b'\n' && *b != b'\r');
            (String::from_utf8_lossy(&v).into_owned(), vec![])
        }),
    ];
    (
        proptest::collection::vec((line, 0usize..4), 0..60),
        any::<bool>(),
    )
        .prop_map(|(lines, final_newline)| {
            let mut bytes = Vec::new();
            let mut values = Vec::new();
            let n = lines.len();
            for (i, ((text, numbers), ending)) in lines.into_iter().enumerate() {
                bytes.extend_from_slice(text.as_bytes());
                if i + 1 < n || final_newline {
                    bytes.extend_from_slice([&b"\n"[..], b"\r\n", b"\r\r\n", b"\r"][ending]);
                }
                values.extend(numbers);
            }
            (bytes, values)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_parse_the_same_in_any_appends(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = batch(&bytes);
        prop_assert_eq!(seen(&stream(&bytes, &cuts, true)), whole);
    }

    #[test]
    fn log_lines_parse_the_same_in_any_appends((bytes, _) in log_lines(), cuts in proptest::collection::vec(any::<usize>(), 0..12)) {
        prop_assert_eq!(seen(&stream(&bytes, &cuts, true)), batch(&bytes));
    }

    #[test]
    fn a_cut_off_writer_yields_only_records_of_the_whole_file(
        (bytes, _) in log_lines(),
        cut in any::<usize>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let cut = cut % (bytes.len() + 1);
        let partial = seen(&stream(&bytes[..cut], &cuts, false));
        let whole = batch(&bytes);
        prop_assert!(
            partial.len() <= whole.len() && partial[..] == whole[..partial.len()],
            "a writer cut at byte {} produced records the whole file does not start with:\n{:?}\nvs\n{:?}",
            cut, partial, whole
        );
    }

    #[test]
    fn no_record_carries_a_value_that_is_not_in_the_input(
        (bytes, written) in log_lines(),
        cut in any::<usize>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        // The whole file, and a writer cut off anywhere (its unterminated line is not parsed).
        let cut = cut % (bytes.len() + 1);
        let whole = stream(&bytes, &cuts, true);
        let partial = stream(&bytes[..cut], &cuts, false);
        for r in whole.iter().chain(&partial) {
            for (name, v) in r.metrics.iter() {
                prop_assert!(
                    !v.is_finite() || written.contains(&v),
                    "{} = {} is not in the input (record {:?})", name, v, r
                );
            }
            for v in r.epoch.into_iter().chain(r.step.map(|s| s as f64)) {
                prop_assert!(written.contains(&v), "counter {} is not in the input", v);
            }
        }
    }
}
