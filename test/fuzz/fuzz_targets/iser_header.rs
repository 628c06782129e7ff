#![no_main]
// Harness and input layout: test/fuzz/src/iser.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| riser_fuzz::iser::run(data));
