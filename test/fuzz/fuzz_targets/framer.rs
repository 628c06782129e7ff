#![no_main]
// Harness and input layout: test/fuzz/src/framer.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| riser_fuzz::framer::run(data));
