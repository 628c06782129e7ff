#![no_main]
// Harness and input layout: test/fuzz/src/session.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| riser_fuzz::session::run(data));
