//! TensorBoard event files through the TFRecord reader and the `Event` decoder: no panic; the
//! same records whether the bytes arrive at once or in appends; a writer cut off early yields a
//! prefix of the whole file's records; the counts of skipped records never exceed the records.
//!
//! The first byte picks the mode: even, the rest is taken as an event file as it is (checksums
//! and all); odd, the rest is cut into pieces at `0xff 0xfe` pairs and each piece is framed with
//! correct checksums, so that the fuzzer reaches the protobuf decoding instead of stopping at a
//! checksum. Bit 1..6 of the same byte set the append size.
//!
//! `cargo +nightly fuzz run tensorboard_events` (from the repository root).
#![no_main]

use std::path::Path;

use governor_progress::record::RecordData;
use governor_progress::tensorboard::EventsDecoder;
use governor_progress::tfrecord::frame;
use libfuzzer_sys::fuzz_target;

fn key(r: &RecordData) -> (Option<u64>, Option<u64>, &'static str, Vec<(String, u64)>) {
    (
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
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let bytes: Vec<u8> = if ctl & 1 == 1 {
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i + 1 < rest.len() {
            if rest[i] == 0xff && rest[i + 1] == 0xfe {
                out.extend(frame(&rest[start..i]));
                start = i + 2;
                i += 2;
            } else {
                i += 1;
            }
        }
        out.extend(frame(&rest[start..]));
        out
    } else {
        rest.to_vec()
    };
    let path = if ctl & 0x80 != 0 {
        Path::new("/logs/validation/events.out.tfevents.1.fuzz")
    } else {
        Path::new("/logs/events.out.tfevents.1.fuzz")
    };

    let mut whole = EventsDecoder::new(path);
    let mut all = Vec::new();
    whole.push(&bytes, &mut all);
    let all_keys: Vec<_> = all.iter().map(key).collect();
    let errors = whole.framing_errors();
    assert!(errors.bad_data_crc + whole.undecodable() <= bytes.len() as u64 / 16 + 1);

    let chunk = usize::from((ctl >> 1) & 0x3f) + 1;
    let cut = bytes.len() * usize::from(ctl) / 255;
    let mut d = EventsDecoder::new(path);
    let mut out = Vec::new();
    let mut at_cut = None;
    for (i, piece) in bytes.chunks(chunk).enumerate() {
        if at_cut.is_none() && i * chunk >= cut {
            at_cut = Some(out.len());
        }
        d.push(piece, &mut out);
    }
    let streamed: Vec<_> = out.iter().map(key).collect();
    assert_eq!(streamed, all_keys, "appends of {chunk} bytes decode differently");
    assert_eq!(d.framing_errors(), errors);

    let mut early = EventsDecoder::new(path);
    let mut first = Vec::new();
    early.push(&bytes[..cut], &mut first);
    let first: Vec<_> = first.iter().map(key).collect();
    assert!(
        first.len() <= all_keys.len() && first[..] == all_keys[..first.len()],
        "a writer cut at {cut} produced records the whole file does not start with"
    );
});
