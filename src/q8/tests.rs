//! The unit tests of the 8-bit format's rules: the maps, the codes, the blocks.

use super::*;

#[test]
fn the_maps_are_sorted_and_span_minus_one_to_one() {
    // The signed map's lowest code is the negated midpoint below 1 of a 65-point grid over
    // [0.1, 1]: -(1 - 0.9 / 128), rounded as bitsandbytes rounds it.
    let lowest_signed = f32::from_bits(0xbf7e_3333);
    for (map, lowest) in [(signed_map(), lowest_signed), (unsigned_map(), 0.0)] {
        assert!(map.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
        assert_eq!(map[0], lowest);
        assert_eq!(map[255], 1.0);
    }
}

/// The midpoint of neighbouring codes `c` and `c + 1` as bitsandbytes' kernels compute it
/// (`(upper + val) * 0.5f`).
fn midpoint(map: &[f32; 256], c: usize) -> f32 {
    (map[c] + map[c + 1]) * 0.5
}

#[test]
fn a_value_takes_the_nearer_code_by_the_f32_midpoints() {
    for map in [signed_map(), unsigned_map()] {
        assert_eq!(nearest_code(&map, 1.0), 255);
        assert_eq!(nearest_code(&map, 2.0), 255);
        assert_eq!(nearest_code(&map, -2.0), 0);
        for c in 0..255 {
            let m = midpoint(&map, c);
            // Positive values, and the negative ones whose code is not the code of 0.
            if map[c] >= 0.0 || map[c + 1] < 0.0 {
                assert_eq!(nearest_code(&map, map[c]), c as u8);
                assert_eq!(nearest_code(&map, m.next_down()), c as u8, "below the midpoint of {c}");
                assert_eq!(nearest_code(&map, m.next_up()), c as u8 + 1, "above the midpoint of {c}");
            }
        }
    }
    assert_eq!(nearest_code(&unsigned_map(), -1.0), 0);
}

/// `quantize_2D`'s binary search ends on an even pivot and keeps it at an exact midpoint.
#[test]
fn a_value_exactly_at_a_midpoint_takes_the_even_code() {
    for map in [signed_map(), unsigned_map()] {
        for c in 0..255usize {
            let m = midpoint(&map, c);
            let even = if c % 2 == 0 { c } else { c + 1 } as u8;
            // The midpoint next to the code of 0 from below is the sign rule's (below).
            if m < 0.0 && map[c + 1] == 0.0 {
                continue;
            }
            assert_eq!(nearest_code(&map, m), even, "the midpoint of {c} and {}", c + 1);
        }
    }
}

/// bitsandbytes' kernels keep a signed state's sign: a negative value whose nearest code is
/// the code of 0 (127), and -0.0, are stored as code 126; positive values and +0.0 are not
/// moved, and the unsigned map has no such rule.
#[test]
fn a_tiny_negative_signed_value_and_minus_zero_keep_their_sign() {
    let signed = signed_map();
    assert_eq!((signed[126] < 0.0, signed[127], signed[128] > 0.0), (true, 0.0, true));
    let switch = midpoint(&signed, 126);
    assert!((2.7e-7..2.8e-7).contains(&-switch), "{switch:e}");
    for x in [-0.0, -1e-45, -f32::MIN_POSITIVE, -1e-20, -1e-7, switch.next_up(), switch] {
        assert_eq!(nearest_code(&signed, x), 126, "{x:e}");
    }
    // Beyond the switch to the code below 126, the nearest code.
    assert_eq!(nearest_code(&signed, signed[125]), 125);
    for x in [0.0, 1e-45, 1e-20, (-switch).next_down()] {
        assert_eq!(nearest_code(&signed, x), 127, "{x:e}");
    }
    assert_eq!(nearest_code(&signed, switch.next_down()), 126, "the nearest code, 126, is kept");
    let unsigned = unsigned_map();
    for x in [-0.0, -1e-7, 0.0, 1e-45] {
        assert_eq!(nearest_code(&unsigned, x), 0, "{x:e}");
    }
}

#[test]
fn quantizing_scales_by_each_blocks_largest_magnitude() {
    let map = signed_map();
    let mut values = vec![0.0f32; BLOCK_SIZE + 3];
    values[5] = -4.0;
    values[7] = 2.0;
    values[BLOCK_SIZE + 1] = 0.5;
    let (mut codes, mut absmax) = (vec![0u8; values.len()], vec![0.0f32; blocks(values.len())]);
    quantize(&values, &map, &mut codes, &mut absmax).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(absmax, [4.0, 0.5]);
    let mut back = vec![0.0f32; values.len()];
    dequantize(&codes, &absmax, &map, &mut back).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back[BLOCK_SIZE + 1], 0.5);
    // -1 is not a code of the signed map: the nearest is its lowest code.
    assert_eq!(back[5], map[0] * 4.0);
    assert!((back[7] - 2.0).abs() < 0.02, "{}", back[7]);
    assert_eq!(back[0], 0.0);

    // An all-zero block keeps absmax 1 and the code of 0 throughout, -0.0 included (the
    // kernel's absmax 0 reads back zeros); beside a non-zero value -0.0 keeps its sign.
    let mut absmax = [0.0f32];
    let mut codes = [0u8; 4];
    quantize(&[0.0, -0.0, 0.0, -0.0], &map, &mut codes, &mut absmax).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((absmax, codes), ([1.0], [127; 4]));
    quantize(&[0.0, -0.0, 0.5, -0.0], &map, &mut codes, &mut absmax).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((absmax, codes), ([0.5], [127, 126, 255, 126]));
}

#[test]
fn mismatched_lengths_are_refused_by_name_and_change_nothing() {
    let map = signed_map();
    let (mut codes, mut absmax) = ([7u8; 300], [3.0f32; 2]);
    let err = quantize(&[0.5; 299], &map, &mut codes, &mut absmax).unwrap_err();
    assert!(err.to_string().contains("codes"), "{err}");
    let err = quantize(&[0.5; 300], &map, &mut codes, &mut [3.0f32; 1]).unwrap_err();
    assert!(err.to_string().contains("absmax"), "{err}");
    assert_eq!((codes, absmax), ([7u8; 300], [3.0f32; 2]));
    let mut values = [9.0f32; 300];
    assert!(dequantize(&codes, &[1.0; 3], &map, &mut values).is_err());
    assert_eq!(values, [9.0f32; 300]);
}

#[test]
fn a_non_finite_value_is_left_out_of_its_blocks_absmax_and_stored_as_zero() {
    for map in [signed_map(), unsigned_map()] {
        let zero = map.iter().position(|&c| c == 0.0).unwrap_or_else(|| panic!("no 0")) as u8;
        assert_eq!(zero_code(&map), zero);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(nearest_code(&map, bad), zero, "{bad}");
            let mut values = vec![0.25f32; 300];
            values[5] = bad;
            values[260] = bad;
            let (mut codes, mut absmax) = (vec![7u8; 300], vec![0.0f32; 2]);
            quantize(&values, &map, &mut codes, &mut absmax).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(absmax, [0.25, 0.25], "{bad}");
            assert_eq!((codes[5], codes[260]), (zero, zero), "{bad}");
            assert_eq!(codes[4], 255, "{bad}: a finite value keeps its code");
            // A block of nothing finite has no scale: absmax 1, as an all-zero block.
            quantize(&[bad; 3], &map, &mut [7u8; 3], &mut absmax[..1]).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(absmax[0], 1.0, "{bad}");
        }
    }
}

/// The oracle's maps and its code (a line-for-line transcription of bitsandbytes'
/// `quantize_2D` binary search and sign fix, written apart from this module) agree with
/// these, at and around every midpoint and code, for tiny values of both signs and -0.0,
/// so the code table that `lut` derives from [`nearest_code`] rests on an independent
/// reference too.
#[test]
fn the_maps_and_nearest_codes_equal_the_oracles() {
    use wgpu_optim_oracle::bnb;
    assert_eq!(signed_map(), bnb::signed_map());
    assert_eq!(unsigned_map(), bnb::unsigned_map());
    for map in [signed_map(), unsigned_map()] {
        // The midpoints and the codes themselves, each with its two neighbours either side.
        let near = |x: f32| [x, x.next_down(), x.next_up(), x.next_down().next_down(), x.next_up().next_up()];
        let midpoints = map.windows(2).flat_map(|w| near((w[0] + w[1]) * 0.5));
        let codes = map.iter().flat_map(|&c| near(c));
        let sweep = (0..=1u32 << 16).map(|i| f32::from_bits(0x3000_0000 + (i << 8)));
        let tiny = [0.0, 1e-45, f32::MIN_POSITIVE, 1e-30, 1e-10, 2.7e-7, 2.8e-7];
        let values: Vec<f32> =
            midpoints.chain(codes).chain(sweep).chain(tiny).flat_map(|x| [x, -x]).collect();
        for x in values.into_iter().chain([2.0, -2.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]) {
            assert_eq!(nearest_code(&map, x), bnb::nearest_code(&map, x), "{x:e} ({:#010x})", x.to_bits());
        }
    }
}

#[test]
fn a_state_reads_back_through_the_map_of_its_kind() {
    assert_eq!(map_for(StateKind::ExpAvg), signed_map());
    assert_eq!(map_for(StateKind::MomentumBuffer), signed_map());
    assert_eq!(map_for(StateKind::ExpAvgSq), unsigned_map());
    let every_code = StoredState::Q8 { codes: (0..=255).collect(), absmax: vec![1.0] };
    for kind in [StateKind::ExpAvg, StateKind::ExpAvgSq] {
        let values = every_code.values(kind).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(values, map_for(kind), "{kind:?}");
    }
}

/// A family of more states than the 8-bit kernels hold is refused by name of the option,
/// up to the bound it runs.
#[test]
fn more_states_than_the_kernels_hold_are_refused() {
    assert!(check_state_count(MAX_STATES).is_ok());
    let err = check_state_count(MAX_STATES + 1).unwrap_err();
    assert!(
        matches!(err, Error::ConflictingOptions { first: "state_storage", second: "algorithm", .. }),
        "{err:?}"
    );
}
