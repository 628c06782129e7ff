#![no_main]
// Harness and input layout: test/fuzz/src/login.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| riser_fuzz::login::run(data));
