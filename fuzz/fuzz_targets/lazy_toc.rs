#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crishim_fuzz::lazy_toc(data));
