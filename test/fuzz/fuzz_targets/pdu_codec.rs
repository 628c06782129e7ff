#![no_main]
// Harness and input layout: test/fuzz/src/codec.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| riser_fuzz::codec::run(data));
