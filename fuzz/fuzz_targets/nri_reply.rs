#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crishim_fuzz::nri_reply(data));
