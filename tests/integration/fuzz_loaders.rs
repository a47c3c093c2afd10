//! Bounded fuzzing of the two file loaders (the checkpoint loader and the conformance-vector
//! reader) with arbitrary and mutated bytes: never a panic, always a typed error or a
//! consistent result, and a refused checkpoint leaves the optimizer as it was. The
//! coverage-guided targets live in fuzz/ (cargo fuzz). Set PROPTEST_CASES for longer runs.

use crate::common;

use proptest::prelude::*;
use wgpu_optim::{Adam, Checkpoint, DType, Error, Optimizer};
use wgpu_optim_testkit::conformance::Case;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256)
}

/// A valid vector file to mutate.
fn vector_bytes() -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors/onnx_adam_doc_test_adam_multiple.safetensors");
    std::fs::read(path).unwrap()
}

/// A mutation: flip bits, overwrite, truncate or insert.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let one = prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(at, bits)| Mutation::Flip(at, bits)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::Set(at, value)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
    ];
    proptest::collection::vec(one, 1..6)
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        let len = bytes.len();
        match m {
            Mutation::Flip(at, bits) => bytes[at % len] ^= bits,
            Mutation::Set(at, value) => bytes[at % len] = *value,
            Mutation::Truncate(at) => bytes.truncate(at % len),
            Mutation::Insert(at, extra) => {
                let at = at % len;
                bytes.splice(at..at, extra.iter().copied());
            }
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_are_refused_by_both_loaders(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let refused = matches!(Case::parse("fuzz", &bytes), Err(Error::BadFile { .. }));
        prop_assert!(refused);
        let refused = matches!(Checkpoint::parse(&bytes), Err(Error::BadFile { .. }));
        prop_assert!(refused);
    }

    #[test]
    fn mutated_vector_files_never_panic(m in mutations()) {
        let bytes = mutate(vector_bytes(), &m);
        match Case::parse("fuzz", &bytes) {
            // Whatever parses is self-consistent: every tensor has its shape's element count.
            Ok(case) => {
                for t in case.tensors.values() {
                    prop_assert_eq!(t.values.len(), t.shape.iter().product::<usize>());
                }
            }
            Err(err) => prop_assert!(matches!(err, Error::BadFile { .. }), "{}", err),
        }
    }
}

#[test]
fn mutated_checkpoints_are_refused_or_loaded_and_never_panic() {
    let ctx = common::ctx();
    let params = vec![ctx.upload("p", &[0.5; 12], DType::F32), ctx.upload("q", &[0.5; 3], DType::F16)];
    let grads = vec![ctx.upload("g", &[0.1; 12], DType::F32), ctx.upload("h", &[0.1; 3], DType::F16)];
    let mut optimizer =
        Optimizer::builder().build(&ctx, Adam { amsgrad: true, ..Adam::default() }, &params).unwrap();
    optimizer.step(&grads).unwrap();
    let good = optimizer.save_to_bytes().unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let optimizer = std::cell::RefCell::new(optimizer);
    let (refused, loaded) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    runner
        .run(&mutations(), |m| {
            let bytes = mutate(good.clone(), &m);
            match optimizer.borrow_mut().load_from_bytes(&bytes) {
                Err(err) => {
                    prop_assert!(matches!(err, Error::BadFile { .. }), "{}", err);
                    refused.set(refused.get() + 1);
                }
                Ok(()) => loaded.set(loaded.get() + 1),
            }
            Ok(())
        })
        .unwrap();
    let mut optimizer = optimizer.into_inner();
    let (refused, loaded) = (refused.get(), loaded.get());
    // Restores a known state, and shows the optimizer still works after every attempt.
    optimizer.load_from_bytes(&good).unwrap();
    optimizer.step(&grads).unwrap();
    eprintln!("mutated checkpoints: {refused} refused, {loaded} loaded (mutations inside tensor data)");
    assert!(refused > 0);
}
