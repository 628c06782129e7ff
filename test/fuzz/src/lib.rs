//! The harnesses behind riser's fuzz targets (`fuzz_targets/*.rs` are one line each), so
//! that `cargo test` in this folder can run every committed seed through them as well.
//!
//! Each harness takes the fuzzer's bytes, drives one public API of riser the way a
//! connection does, and checks what must hold whatever the peer sent (no panic, limits
//! respected, encode/decode agreeing). Input layouts are documented per harness; the seed
//! corpora under `corpus/<target>/` follow them (`scripts/fuzz-seeds.sh` writes them).

#![forbid(unsafe_code)]

pub mod codec;
pub mod framer;
pub mod iser;
pub mod login;
pub mod scsi;
pub mod session;
pub mod text;

/// A small deterministic generator (xorshift64*) for chunk sizes and the like: the same
/// input always runs the same way, so every crash reproduces.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `1..=max` (max at least 1).
    pub fn chunk(&mut self, max: usize) -> usize {
        1 + (self.next() % max.max(1) as u64) as usize
    }
}

/// Takes one byte off the front of `data` (0 when empty).
pub fn take_u8(data: &mut &[u8]) -> u8 {
    match data.split_first() {
        Some((b, rest)) => {
            *data = rest;
            *b
        }
        None => 0,
    }
}

/// Takes `n` bytes off the front of `data` (fewer when it is shorter).
pub fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(data.len());
    let (head, rest) = data.split_at(n);
    *data = rest;
    head
}

/// Big-endian number of `n` (at most 8) bytes off the front of `data`.
pub fn take_be(data: &mut &[u8], n: usize) -> u64 {
    take(data, n.min(8))
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Overwrites the header and data digests of every whole PDU in a TCP stream with the right
/// CRC32C, walking it the way the framer does, so that the fuzzer gets past the digest
/// checks (it cannot compute a CRC itself). Partial trailing PDUs are left alone.
pub fn fix_digests(stream: &mut [u8], digests: riser_iscsi::Digests) {
    use riser_iscsi::digest;
    use riser_iscsi::pdu::{padded_len, BHS_LEN, DIGEST_LEN};
    let mut pos = 0usize;
    while let Some(bhs) = stream.get(pos..pos + BHS_LEN) {
        let ahs = usize::from(bhs[4]) * 4;
        let dsl = (usize::from(bhs[5]) << 16) | (usize::from(bhs[6]) << 8) | usize::from(bhs[7]);
        let covered = BHS_LEN + ahs;
        let header_len = covered + if digests.header { DIGEST_LEN } else { 0 };
        if digests.header {
            let Some(h) = stream.get(pos..pos + covered) else {
                return;
            };
            let crc = digest::to_wire(digest::crc32c(h));
            let Some(slot) = stream.get_mut(pos + covered..pos + header_len) else {
                return;
            };
            slot.copy_from_slice(&crc);
        }
        pos += header_len;
        if dsl == 0 {
            continue;
        }
        let padded = padded_len(dsl);
        if digests.data {
            let Some(d) = stream.get(pos..pos + padded) else {
                return;
            };
            let crc = digest::to_wire(digest::crc32c(d));
            let Some(slot) = stream.get_mut(pos + padded..pos + padded + DIGEST_LEN) else {
                return;
            };
            slot.copy_from_slice(&crc);
            pos += DIGEST_LEN;
        }
        pos += padded;
    }
}

#[cfg(test)]
mod seeds {
    //! Every committed seed runs through its harness: the corpora stay valid inputs, and a
    //! crash reproducer dropped into a corpus folder becomes a regression test here too.

    use std::path::Path;

    fn run_corpus(target: &str, harness: fn(&[u8])) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("corpus entry").path();
            let bytes = std::fs::read(&path).expect("read seed");
            harness(&bytes);
            n += 1;
        }
        assert!(n > 0, "no seeds in {}", dir.display());
    }

    #[test]
    fn framer() {
        run_corpus("framer", crate::framer::run);
    }

    #[test]
    fn pdu_codec() {
        run_corpus("pdu_codec", crate::codec::run);
    }

    #[test]
    fn text() {
        run_corpus("text", crate::text::run);
    }

    #[test]
    fn login() {
        run_corpus("login", crate::login::run);
    }

    #[test]
    fn iser_header() {
        run_corpus("iser_header", crate::iser::run);
    }

    #[test]
    fn scsi_cdb() {
        run_corpus("scsi_cdb", crate::scsi::run);
    }

    #[test]
    fn session() {
        run_corpus("session", crate::session::run);
    }
}
