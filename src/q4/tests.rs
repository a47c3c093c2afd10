use super::*;

/// FORMAT.md's listing of torchao's `qmap1` (decimal; the F32 values are within an ulp).
const LISTED_SIGNED: [f64; 16] = [
    -0.8875, -0.6625, -0.4375, -0.2125, -0.0775, -0.0325, -0.0055, 0.0, 0.0055, 0.0325, 0.0775, 0.2125,
    0.4375, 0.6625, 0.8875, 1.0,
];

#[test]
fn the_maps_are_torchaos_listed_values() {
    for (got, listed) in signed_map().iter().zip(LISTED_SIGNED) {
        assert!((f64::from(*got) - listed).abs() <= 1e-7 * listed.abs().max(1e-3), "{got} against {listed}");
    }
    let unsigned = unsigned_map();
    for (k, got) in unsigned.iter().enumerate() {
        assert_eq!(*got, (k + 1) as f32 / 16.0);
    }
    assert!(signed_map().windows(2).all(|w| w[0] < w[1]));
    assert_eq!(map_for(StateKind::ExpAvg), signed_map());
    assert_eq!(map_for(StateKind::ExpAvgSq), unsigned);
}

#[test]
fn every_code_round_trips() {
    for map in [signed_map(), unsigned_map()] {
        for (c, &value) in map.iter().enumerate() {
            assert_eq!(usize::from(nearest_code(&map, value)), c, "{value}");
            // A block of every entry has scale 1 (1 is the largest magnitude of both maps),
            // so each comes back as itself.
            for scale in [1.0f32, 0.25, 3.0e-5] {
                let values: Vec<f32> = map.iter().map(|v| v * scale).collect();
                let (mut codes, mut scales) = (vec![0u8; 8], vec![0.0f32; 1]);
                quantize_into(&values, &map, 16, &mut codes, &mut scales);
                assert_eq!(scales, [scale]);
                assert_eq!(unpack(&codes, 16), (0..16).collect::<Vec<u8>>());
                let mut back = vec![0.0f32; 16];
                dequantize_into(&codes, &scales, &map, 16, &mut back);
                assert_eq!(back, values);
            }
        }
    }
}

#[test]
fn a_tie_goes_to_the_larger_entry() {
    for map in [signed_map(), unsigned_map()] {
        for c in 0..15 {
            let (lo, hi) = (map[c], map[c + 1]);
            // torchao's test: x - lo >= (hi - lo) * 0.5 takes hi. Find the smallest x that
            // passes it by stepping from below, and check both sides of it.
            let half = (hi - lo) * 0.5;
            let mut x = (lo + hi) / 2.0;
            while x - lo >= half {
                x = x.next_down();
            }
            assert_eq!(usize::from(nearest_code(&map, x)), c, "{x:e} below the tie between {lo} and {hi}");
            let x = x.next_up();
            assert_eq!(usize::from(nearest_code(&map, x)), c + 1, "{x:e} at the tie between {lo} and {hi}");
        }
        // Below the first entry and above the last: the end codes.
        assert_eq!(nearest_code(&map, -2.0), 0);
        assert_eq!(nearest_code(&map, 2.0), 15);
    }
    // An exact midpoint (0.5 * (1/16 + 2/16) = 3/32, representable) goes up.
    assert_eq!(nearest_code(&unsigned_map(), 3.0 / 32.0), 1);
}

#[test]
fn nearest_code_is_the_nearest_entry_away_from_ties() {
    for map in [signed_map(), unsigned_map()] {
        for i in -1000..=1000 {
            let x = i as f32 / 1000.0;
            let nearest = (0..16).min_by(|&a, &b| (x - map[a]).abs().total_cmp(&(x - map[b]).abs()));
            let nearest = nearest.unwrap_or(0);
            let distance = (x - map[nearest]).abs();
            let other =
                (0..16).filter(|&c| c != nearest).map(|c| (x - map[c]).abs()).fold(f32::MAX, f32::min);
            if other - distance > 1e-6 {
                assert_eq!(usize::from(nearest_code(&map, x)), nearest, "{x}");
            }
        }
    }
}

#[test]
fn codes_pack_two_per_byte_with_the_even_element_high() {
    assert_eq!(pack(&[1, 2, 15, 0, 7]), [0x12, 0xf0, 0x70]);
    assert_eq!(unpack(&[0x12, 0xf0], 4), [1, 2, 15, 0]);
    let codes: Vec<u8> = (0..64).map(|i| (i * 7 % 16) as u8).collect();
    assert_eq!(unpack(&pack(&codes), 64), codes);
}

#[test]
fn a_non_finite_value_takes_the_code_of_zero_and_is_left_out_of_the_scale() {
    for map in [signed_map(), unsigned_map()] {
        let zero = zero_code(&map);
        assert_eq!(map[usize::from(zero)], if map[0] > 0.0 { map[0] } else { 0.0 });
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(nearest_code(&map, bad), zero);
            let mut values = vec![0.5f32; 16];
            values[3] = bad;
            let (mut codes, mut scales) = (vec![0u8; 8], vec![0.0f32; 1]);
            quantize_into(&values, &map, 16, &mut codes, &mut scales);
            assert_eq!(scales, [0.5]);
            assert_eq!(unpack(&codes, 16)[3], zero);
            assert_eq!(unpack(&codes, 16)[2], 15);
        }
    }
    // A block of zeros keeps torchao's smallest scale.
    assert_eq!(block_scale(&[0.0; 8]), MIN_SCALE);
}

#[test]
fn which_tensors_keep_4bit_state() {
    let config = Q4States::default();
    assert_eq!((config.block_size, config.min_size), (128, 4096));
    assert!(config.quantizes(4096));
    assert!(!config.quantizes(4095));
    assert!(!config.quantizes(4096 + 64), "not a whole number of blocks");
    assert!(config.quantizes(8192 + 128));
    for bad in [0, 6, 12, 4096] {
        let err = Q4States { block_size: bad, ..config }.validate().unwrap_err();
        assert!(err.to_string().contains("block_size"), "{err}");
    }
}

#[test]
fn a_replacement_must_be_stored_as_the_tensors_state_is() {
    let config = Q4States::default();
    let good = Q4State::zeros(4096, true, 128);
    check_replacement(&good, config, 4096, "s").unwrap_or_else(|e| panic!("{e}"));
    assert!(check_replacement(&good, config, 8192, "s").is_err());
    assert!(check_replacement(&Q4State::F32(vec![0.0; 4096]), config, 4096, "s").is_err());
    check_replacement(&Q4State::F32(vec![0.0; 100]), config, 100, "s").unwrap_or_else(|e| panic!("{e}"));
    let bad = Q4State::Q4 { codes: vec![0; 2048], scale: vec![f32::NAN; 32] };
    let err = check_replacement(&bad, config, 4096, "s").unwrap_err();
    assert!(err.to_string().contains("scale[0]"), "{err}");
    let short = Q4State::Q4 { codes: vec![0; 2048], scale: vec![1.0; 31] };
    assert!(check_replacement(&short, config, 4096, "s").is_err());
}

#[test]
fn what_4bit_state_does_not_run_is_refused_by_name() {
    let amsgrad = crate::Adam { amsgrad: true, ..crate::Adam::adamw() };
    let maximize = crate::Adam { maximize: true, ..crate::Adam::default() };
    for algorithm in [amsgrad.into(), maximize.into(), crate::Algorithm::Sgd(crate::Sgd::default())] {
        let err = check_algorithm(&algorithm).unwrap_err();
        assert!(err.to_string().contains("state_storage"), "{err}");
    }
    check_algorithm(&crate::Adam::default().into()).unwrap_or_else(|e| panic!("{e}"));
}

/// The kernels' form of the rounding (a count of thresholds) finds torchao's code for every
/// value near an entry, a midpoint or a threshold, and over a sweep of magnitudes.
#[test]
fn counting_thresholds_finds_torchaos_code() {
    for map in [signed_map(), unsigned_map()] {
        let t = thresholds(&map);
        let zero = zero_code(&map);
        let near = |x: f32| [x, x.next_down(), x.next_up(), -x, -x.next_down(), -x.next_up()];
        let midpoints = map.windows(2).map(|w| (w[0] + w[1]) / 2.0);
        let sweep = (0..=1u32 << 16).map(|i| f32::from_bits(0x2000_0000 + (i << 9)));
        let values: Vec<f32> =
            map.iter().copied().chain(midpoints).chain(t).chain(sweep).flat_map(near).collect();
        for x in
            values.into_iter().chain([0.0, -0.0, 2.0, -2.0, 1e30, f32::NAN, f32::INFINITY, f32::NEG_INFINITY])
        {
            assert_eq!(code_by_thresholds(&t, zero, x), nearest_code(&map, x), "{x:e}");
        }
    }
}
