//! The checks made before anything is created on the device: parameters, shapes, rounding,
//! and memory that two tensors must not share.

use crate::gpu::plan::{check_range, Arg};
use crate::{DType, Error, OptimizerOptions, Result, Rounding, Tensor};

/// Stochastic and Kahan rounding keep the low-precision parameters themselves accurate; f32
/// masters (and model copies, which are written from f32 parameters) leave nothing to do.
pub(crate) fn check_rounding_options(options: &OptimizerOptions) -> Result<()> {
    if options.rounding == Rounding::NearestEven {
        return Ok(());
    }
    let reason = "stochastic and Kahan rounding keep 16-bit parameters accurate without f32 masters; \
                  with f32 masters the model copy is rounded once from exact values";
    if options.master_weights {
        return Err(Error::ConflictingOptions { first: "rounding", second: "master_weights", reason });
    }
    if !options.model_copies.is_empty() {
        return Err(Error::ConflictingOptions { first: "rounding", second: "model_copies", reason });
    }
    Ok(())
}

/// Refuses two tensors that share a byte; names them in the order given. Sorting by buffer
/// and offset keeps this O(n log n) for models with thousands of tensors.
pub(super) fn check_disjoint(args: &[Arg]) -> Result<()> {
    let mut order: Vec<usize> = (0..args.len()).filter(|&i| args[i].tensor.len > 0).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&args[a].tensor, &args[b].tensor);
        a.buffer.cmp(&b.buffer).then(a.offset.cmp(&b.offset))
    });
    // The tensor reaching furthest into the current buffer so far.
    let mut furthest: Option<usize> = None;
    for &i in &order {
        let t = &args[i].tensor;
        if let Some(f) = furthest.filter(|&f| args[f].tensor.buffer == t.buffer) {
            if t.offset < args[f].tensor.byte_range().end {
                let (first, second) = (f.min(i), f.max(i));
                return Err(Error::OverlappingParams {
                    first: args[first].name.clone(),
                    second: args[second].name.clone(),
                });
            }
            if t.byte_range().end <= args[f].tensor.byte_range().end {
                continue;
            }
        }
        furthest = Some(i);
    }
    Ok(())
}

/// Checks the parameters and options; returns the math type (f64 only for f64 parameters).
pub(super) fn check_params(params: &[Tensor], options: &OptimizerOptions) -> Result<DType> {
    if params.is_empty() {
        return Err(Error::NoParameters { argument: "params".into() });
    }
    let double = params.first().is_some_and(|p| p.dtype == DType::F64);
    for (i, p) in params.iter().enumerate() {
        check_range(&Arg::new(format!("params[{i}]"), p))?;
        if (p.dtype == DType::F64) != double {
            return Err(Error::DTypeMismatch {
                argument: format!("params[{i}]"),
                got: p.dtype,
                expected: "F64 for every parameter or for none (the math runs in one type)".into(),
            });
        }
    }
    if let Some(dtype) = options.state_storage.dtype() {
        if (dtype == DType::F64) != double {
            return Err(Error::DTypeMismatch {
                argument: "options.state_storage".into(),
                got: dtype,
                expected: if double { "F64 for F64 parameters".into() } else { "F32, F16 or BF16".into() },
            });
        }
    }
    if !options.model_copies.is_empty() && options.model_copies.len() != params.len() {
        return Err(Error::CountMismatch {
            argument: "options.model_copies".into(),
            got: options.model_copies.len(),
            expected: params.len(),
        });
    }
    for (i, (copy, p)) in options.model_copies.iter().zip(params).enumerate() {
        check_range(&Arg::new(format!("model_copies[{i}]"), copy))?;
        if copy.len != p.len {
            return Err(Error::LengthMismatch {
                argument: format!("model_copies[{i}]"),
                got: copy.len,
                expected: p.len,
                reference: format!("params[{i}]"),
            });
        }
    }
    let named = params.iter().enumerate().map(|(i, p)| Arg::new(format!("params[{i}]"), p)).chain(
        options.model_copies.iter().enumerate().map(|(i, c)| Arg::new(format!("model_copies[{i}]"), c)),
    );
    check_disjoint(&named.collect::<Vec<_>>())?;
    Ok(if double { DType::F64 } else { DType::F32 })
}
