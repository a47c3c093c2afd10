//! `cargo fuzz run vectors`: the conformance-vector reader on arbitrary bytes must return a
//! typed error or a self-consistent case, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(case) = wgpu_optim_testkit::conformance::Case::parse("fuzz", data) {
        for tensor in case.tensors.values() {
            assert_eq!(tensor.values.len(), tensor.shape.iter().product::<usize>());
        }
    }
});
