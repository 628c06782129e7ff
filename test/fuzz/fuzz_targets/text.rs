#![no_main]
// Harness and input layout: test/fuzz/src/text.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| riser_fuzz::text::run(data));
