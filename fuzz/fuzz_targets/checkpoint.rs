//! `cargo fuzz run checkpoint`: the checkpoint parser on arbitrary bytes must return a
//! typed error or a consistent checkpoint, never panic, and allocate no more than the
//! input's size (the parser copies no tensor data).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(checkpoint) = wgpu_optim::Checkpoint::parse(data) {
        for (algorithm, params) in &checkpoint.groups {
            // Whatever parses is valid: its hyperparameters pass the optimizers' checks.
            assert!(algorithm.validate().is_ok());
            assert!(params.len() <= data.len());
        }
    }
});
