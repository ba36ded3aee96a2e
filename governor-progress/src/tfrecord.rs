//! TFRecord framing, as TensorBoard event files use it: each record is
//!
//! ```text
//! u64 length (little-endian) | u32 masked CRC32C of the 8 length bytes | length bytes of data |
//! u32 masked CRC32C of the data
//! ```
//!
//! [`RecordReader`] is fed appended bytes and hands out each record once its bytes and both
//! checksums are complete: a torn tail (a writer between two `write`s) waits for the rest. A data
//! checksum that does not match skips that one record (the length was sound, so the next record
//! starts where it says) and is counted; a length checksum that does not match means the framing
//! itself is lost: the reader stops, counts it, and drops what follows (a writer never resumes
//! the framing in the middle of a file).
//!
//! CRC32C (Castagnoli) is computed here with a slicing-by-8 table built at compile time rather
//! than with a crate: it is ~40 lines, needs no `unsafe` (the crates that use SSE4.2 do), and is
//! tested against RFC 3720's vectors and against files written by TensorFlow's and PyTorch's own
//! writers (`tests/progress_tensorboard.rs`). Event records are ~50-200 bytes: the table runs at
//! well over 1 GB/s, far beyond what a training job writes.

/// Longest record accepted (64 MiB): event files of scalars hold records of ~100 bytes, images
/// and graphs a few MB; a longer length is taken as corrupt framing.
pub const MAX_RECORD_BYTES: u64 = 64 << 20;

const POLY: u32 = 0x82f6_3b78; // CRC32C, reflected.

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut j = 1;
        while j < 8 {
            let prev = t[j - 1][i];
            t[j][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            j += 1;
        }
        i += 1;
    }
    t
}

static TABLES: [[u32; 256]; 8] = tables();

/// CRC32C (Castagnoli) of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    let t = &TABLES;
    let mut crc = !0u32;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ crc;
        let hi = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xff) as usize]
            ^ t[2][((hi >> 8) & 0xff) as usize]
            ^ t[1][((hi >> 16) & 0xff) as usize]
            ^ t[0][(hi >> 24) as usize];
    }
    for &b in chunks.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ u32::from(b)) & 0xff) as usize];
    }
    !crc
}

/// TFRecord's masked CRC (so that a CRC of data that holds CRCs stays well distributed).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Frames `data` as one TFRecord (tests, fuzzing and benchmarks write event files with it).
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// True when `head` (at least 12 bytes) starts like a TFRecord: a length whose checksum holds.
pub fn looks_like_tfrecord(head: &[u8]) -> bool {
    head.len() >= 12 && {
        let len = &head[..8];
        let crc = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        masked_crc32c(len) == crc
            && u64::from_le_bytes(len.try_into().expect("8")) <= MAX_RECORD_BYTES
    }
}

/// True when `head` (any length) cannot be the start of a TFRecord: its length field, a
/// little-endian u64 of at most [`MAX_RECORD_BYTES`] (2^26), has zero bytes 4 to 7 and a byte 3
/// below 4. Any text does not: a text log is told from an event file by its first 4 bytes.
pub fn cannot_be_tfrecord(head: &[u8]) -> bool {
    head.get(3).is_some_and(|b| *b >= 4) || head.iter().skip(4).take(4).any(|b| *b != 0)
}

/// What the reader found wrong so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FramingErrors {
    /// Records skipped because their data checksum did not match.
    pub bad_data_crc: u64,
    /// The framing was lost (a length whose checksum did not match, or too long): nothing more
    /// of the file is read.
    pub lost: bool,
}

/// Incremental TFRecord reader (see the module documentation).
#[derive(Debug, Default)]
pub struct RecordReader {
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    start: usize,
    errors: FramingErrors,
}

impl RecordReader {
    pub fn new() -> Self {
        RecordReader::default()
    }

    /// Errors so far.
    pub fn errors(&self) -> FramingErrors {
        self.errors
    }

    /// Bytes held waiting for the rest of a record.
    pub fn pending_bytes(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Feeds appended bytes; calls `on_record` with the data of every record they complete.
    pub fn push(&mut self, bytes: &[u8], mut on_record: impl FnMut(&[u8])) {
        if self.errors.lost {
            return;
        }
        // Records wholly inside `bytes` with nothing held are handed out without a copy.
        let mut rest = bytes;
        if self.pending_bytes() == 0 {
            self.buf.clear();
            self.start = 0;
            let used = self.take(rest, &mut on_record);
            rest = &rest[used..];
            if self.errors.lost {
                return;
            }
        }
        if rest.is_empty() {
            return;
        }
        self.buf.extend_from_slice(rest);
        let held = std::mem::take(&mut self.buf);
        let used = self.take(&held[self.start..], &mut on_record);
        self.buf = held;
        self.start += used;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 1 << 16 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// The file was truncated or replaced: what was held is dropped and framing starts over.
    pub fn reset(&mut self) {
        self.buf.clear();
        self.start = 0;
        self.errors.lost = false;
    }

    /// Takes the complete records at the start of `b`; returns the bytes used.
    fn take(&mut self, b: &[u8], on_record: &mut impl FnMut(&[u8])) -> usize {
        let mut at = 0;
        loop {
            let rest = &b[at..];
            if rest.len() < 12 {
                return at;
            }
            let len_bytes = &rest[..8];
            let len_crc = u32::from_le_bytes(rest[8..12].try_into().expect("4"));
            let len = u64::from_le_bytes(len_bytes.try_into().expect("8"));
            if masked_crc32c(len_bytes) != len_crc || len > MAX_RECORD_BYTES {
                self.errors.lost = true;
                return b.len();
            }
            let total = 12 + len as usize + 4;
            if rest.len() < total {
                return at;
            }
            let data = &rest[12..12 + len as usize];
            let data_crc = u32::from_le_bytes(rest[total - 4..total].try_into().expect("4"));
            if masked_crc32c(data) == data_crc {
                on_record(data);
            } else {
                self.errors.bad_data_crc += 1;
            }
            at += total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_rfc3720_vectors() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46dd_794e);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113f_db5c);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn records_come_out_once_complete_in_any_split() {
        let mut file = frame(b"first");
        file.extend(frame(b""));
        file.extend(frame(&[7u8; 300]));
        for cut in 1..file.len() {
            let mut r = RecordReader::new();
            let mut got: Vec<Vec<u8>> = Vec::new();
            r.push(&file[..cut], |d| got.push(d.to_vec()));
            let early = got.len();
            r.push(&file[cut..], |d| got.push(d.to_vec()));
            assert_eq!(got.len(), 3, "cut at {cut}");
            assert_eq!(got[0], b"first");
            assert!(got[1].is_empty());
            assert_eq!(r.pending_bytes(), 0);
            assert!(early < 3 || cut == file.len());
        }
        // Byte by byte.
        let mut r = RecordReader::new();
        let mut n = 0;
        for b in &file {
            r.push(std::slice::from_ref(b), |_| n += 1);
        }
        assert_eq!(n, 3);
    }

    #[test]
    fn a_torn_tail_waits_for_the_rest() {
        let rec = frame(b"abcdef");
        let mut r = RecordReader::new();
        let mut n = 0;
        r.push(&rec[..rec.len() - 1], |_| n += 1);
        assert_eq!((n, r.pending_bytes()), (0, rec.len() - 1));
        r.push(&rec[rec.len() - 1..], |_| n += 1);
        assert_eq!((n, r.pending_bytes()), (1, 0));
        assert_eq!(r.errors(), FramingErrors::default());
    }

    #[test]
    fn a_bad_data_checksum_skips_that_record_only() {
        let mut file = frame(b"one");
        let mut bad = frame(b"two");
        bad[13] ^= 0x20;
        file.extend(bad);
        file.extend(frame(b"three"));
        let mut r = RecordReader::new();
        let mut got = Vec::new();
        r.push(&file, |d| got.push(d.to_vec()));
        assert_eq!(got, vec![b"one".to_vec(), b"three".to_vec()]);
        assert_eq!(r.errors().bad_data_crc, 1);
        assert!(!r.errors().lost);
    }

    #[test]
    fn a_bad_length_checksum_stops_the_file() {
        let mut file = frame(b"one");
        let mut bad = frame(b"two");
        bad[0] ^= 1;
        file.extend(bad);
        file.extend(frame(b"three"));
        let mut r = RecordReader::new();
        let mut got = Vec::new();
        r.push(&file, |d| got.push(d.to_vec()));
        assert_eq!(got, vec![b"one".to_vec()]);
        assert!(r.errors().lost);
        r.push(&frame(b"four"), |d| got.push(d.to_vec()));
        assert_eq!(got.len(), 1, "nothing after lost framing");
        assert!(looks_like_tfrecord(&frame(b"x")));
        assert!(!looks_like_tfrecord(b"epoch,loss\n0,1.5\n"));
        assert!(cannot_be_tfrecord(b"ep,l"));
        assert!(!cannot_be_tfrecord(&frame(b"x")[..8]));
        assert!(!cannot_be_tfrecord(b"ep"), "too short to tell");
    }
}
