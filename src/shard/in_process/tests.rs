//! The in-process transport with 1 to 4 ranks: what every rank receives, and that faults
//! end collectives with an error on every rank instead of a hang.

use std::time::{Duration, Instant};

use crate::shard::{Communicator, InProcess, ReduceOp};
use crate::Error;

const LONG: Duration = Duration::from_secs(60);

/// Runs `f` on every rank of a group of `size`, each on its own thread, and returns their
/// results in rank order.
fn on_ranks<T: Send>(size: usize, timeout: Duration, f: impl Fn(&InProcess) -> T + Sync) -> Vec<T> {
    let ranks = InProcess::group(size, timeout).unwrap();
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks.into_iter().map(|rank| s.spawn(move || f(&rank))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Values whose sum depends on the order they are added in, so that a sum in any other
/// order than rank order would show.
fn contribution(rank: usize) -> Vec<f64> {
    [vec![1.0, 3e-17, -0.5], vec![1e16, 0.1, 2.0], vec![-1e16, 0.2, f64::MIN_POSITIVE], vec![1.0, 0.3, -7.25]]
        [rank]
        .clone()
}

#[test]
fn sums_are_added_in_rank_order_and_every_rank_gets_the_same_bits() {
    for size in 1..=4 {
        let want: Vec<f64> =
            (0..3).map(|i| (1..size).fold(contribution(0)[i], |acc, r| acc + contribution(r)[i])).collect();
        let got = on_ranks(size, LONG, |c| {
            let mut values = contribution(c.rank());
            c.all_reduce_f64(&mut values, ReduceOp::Sum).unwrap();
            values
        });
        for (rank, values) in got.iter().enumerate() {
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(values), bits(&want), "{size} ranks, rank {rank}");
        }
    }
    // The contributions tell the orders apart: added from the last rank down, 4 ranks'
    // sums have other bits.
    let reversed: Vec<f64> =
        (0..3).map(|i| (0..3).rev().fold(contribution(3)[i], |acc, r| acc + contribution(r)[i])).collect();
    let in_order: Vec<f64> =
        (0..3).map(|i| (1..4).fold(contribution(0)[i], |acc, r| acc + contribution(r)[i])).collect();
    assert_ne!(reversed, in_order);
}

#[test]
fn max_is_every_ranks_largest_and_nan_wins() {
    let got = on_ranks(3, LONG, |c| {
        let mut values = [c.rank() as f64, -(c.rank() as f64), if c.rank() == 1 { f64::NAN } else { 0.0 }];
        c.all_reduce_f64(&mut values, ReduceOp::Max).unwrap();
        values
    });
    for values in got {
        assert_eq!(values[..2], [2.0, 0.0]);
        assert!(values[2].is_nan());
    }
}

#[test]
fn all_gather_concatenates_in_rank_order() {
    for size in 1..=4 {
        let got = on_ranks(size, LONG, |c| {
            let first = c.all_gather_bytes(&[c.rank() as u8, 10 + c.rank() as u8]).unwrap();
            c.barrier().unwrap();
            let second = c.all_gather_bytes(&[100 + c.rank() as u8]).unwrap();
            (first, second)
        });
        let want_first: Vec<u8> = (0..size as u8).flat_map(|r| [r, 10 + r]).collect();
        let want_second: Vec<u8> = (0..size as u8).map(|r| 100 + r).collect();
        for (first, second) in got {
            assert_eq!((first, second), (want_first.clone(), want_second.clone()));
        }
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_shard_of_the_rank_order_sum() {
    for size in 1..=4 {
        // Two elements per shard; element i of rank r is one of the order-sensitive values.
        let input = |rank: usize| -> Vec<f32> {
            (0..2 * size).map(|i| [1e8f32, 1.0, -1e8, 0.1][(rank + i) % 4] * (1 + i % 3) as f32).collect()
        };
        let sum: Vec<f32> =
            (0..2 * size).map(|i| (1..size).fold(input(0)[i], |acc, r| acc + input(r)[i])).collect();
        let got = on_ranks(size, LONG, |c| c.reduce_scatter_f32(&input(c.rank())).unwrap());
        for (rank, shard) in got.iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(shard), bits(&sum[2 * rank..2 * rank + 2]), "{size} ranks, rank {rank}");
        }
    }
    let got = on_ranks(3, LONG, |c| c.reduce_scatter_f32(&[1.0; 4]));
    for result in got {
        let err = result.unwrap_err();
        assert!(err.to_string().contains("16 bytes do not split into 3 equal chunks"), "{err}");
    }
    // Ranks that pass different lengths: the error names the collective the caller made.
    let got = on_ranks(2, LONG, |c| c.reduce_scatter_f32(&vec![1.0; 2 + 2 * c.rank()]));
    for result in got {
        let err = result.unwrap_err();
        assert!(
            err.to_string().starts_with("reduce_scatter (all_to_all (all_gather)) on rank")
                && err.to_string().contains("[8, 16]"),
            "{err}"
        );
    }
}

#[test]
fn all_to_all_hands_rank_r_every_ranks_chunk_r() {
    let got = on_ranks(3, LONG, |c| {
        c.all_to_all_bytes(&[10 * c.rank() as u8, 10 * c.rank() as u8 + 1, 10 * c.rank() as u8 + 2]).unwrap()
    });
    assert_eq!(got, [vec![0, 10, 20], vec![1, 11, 21], vec![2, 12, 22]]);
}

#[test]
fn different_lengths_are_refused_on_every_rank() {
    let got = on_ranks(3, LONG, |c| c.all_gather_bytes(&vec![0u8; 4 + 4 * (c.rank() == 2) as usize]));
    for (rank, result) in got.into_iter().enumerate() {
        let err = result.unwrap_err();
        assert!(
            matches!(&err, Error::Collective { rank: r, size: 3, problem, .. } if *r == rank && problem.contains("[4, 4, 8]")),
            "{err}"
        );
    }
}

#[test]
fn a_configuration_that_differs_is_refused_on_every_rank_by_rank() {
    let same = on_ranks(3, LONG, |c| c.check_same("layout", b"flat, 3 ranks, AdamW"));
    assert!(same.iter().all(Result::is_ok));
    let got = on_ranks(3, LONG, |c| {
        let config: &[u8] = if c.rank() == 2 { b"flat, 3 ranks, Lion" } else { b"flat, 3 ranks, AdamW" };
        c.check_same("algorithm", config)
    });
    for result in got {
        let err = result.unwrap_err();
        assert!(err.to_string().contains("rank 2's algorithm differs from rank 0's"), "{err}");
    }
}

#[test]
fn a_rank_that_panics_ends_the_others_collectives_at_once() {
    let start = Instant::now();
    let ranks = InProcess::group(3, LONG).unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    c.barrier().unwrap();
                    if c.rank() == 1 {
                        panic!("rank 1 fails mid-step");
                    }
                    let mut norm = [1.0];
                    c.all_reduce_f64(&mut norm, ReduceOp::Sum)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    assert!(results[1].is_err(), "rank 1 panicked");
    for rank in [0, 2] {
        let err = results[rank].as_ref().unwrap().as_ref().unwrap_err();
        assert!(err.to_string().contains("rank 1"), "{err}");
    }
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
}

#[test]
fn a_rank_that_never_comes_times_out_naming_it() {
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let got = on_ranks(3, timeout, |c| {
        if c.rank() == 0 {
            // Waits past the others' timeout, then stays out of the collective.
            std::thread::sleep(Duration::from_millis(400));
            return None;
        }
        Some(c.barrier())
    });
    let errors: Vec<String> = got.into_iter().flatten().map(|r| r.unwrap_err().to_string()).collect();
    assert_eq!(errors.len(), 2);
    // The first rank to give up names the one missing; the other gives up at its own
    // deadline or, sooner, when the first one's handle is dropped.
    assert!(errors.iter().any(|e| e.contains("ranks [0] did not join within 200ms")), "{errors:?}");
    assert!(errors.iter().all(|e| e.contains("did not join") || e.contains("left the group")), "{errors:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_group_of_no_ranks_is_refused() {
    assert!(matches!(InProcess::group(0, LONG), Err(Error::BadValue { .. })));
}
