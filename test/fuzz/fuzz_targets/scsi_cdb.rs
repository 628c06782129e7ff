#![no_main]
// Harness and input layout: test/fuzz/src/scsi.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| riser_fuzz::scsi::run(data));
