//! DirectML's binding rule on the GPU: every output may alias its input exactly, or any
//! other input exactly; a partial overlap or two outputs on one range is a typed error
//! before anything is recorded. Also tensors that share one buffer at unaligned offsets.

use crate::common;

use common::{assert_tensor, ctx, to_f32, Rng};
use wgpu_optim::ops::directml::{self, AdamOptimizerDesc, TrainingStep};
use wgpu_optim::ops::{self, Update};
use wgpu_optim::q8::Q8States;
use wgpu_optim::{Adam, DType, DmlAdam, Error, GpuContext, Optimizer, StateKind, StateStorage, Tensor};
use wgpu_optim_testkit::oracle::{self, torch_adam_step, ToOracle, TorchAdamState};

const DML: DmlAdam = DmlAdam { learning_rate: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 };

struct DmlCase {
    p: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
}

impl DmlCase {
    fn new(len: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        DmlCase {
            p: rng.vec(len, 1.0),
            m: rng.vec(len, 0.1),
            v: rng.positive(len, 0.01),
            g: rng.vec(len, 1.0),
        }
    }

    fn inputs(&self, ctx: &GpuContext) -> [Tensor; 4] {
        [&self.p, &self.m, &self.v, &self.g].map(|values| ctx.upload_f32("input", &to_f32(values)))
    }

    fn desc(&self, inputs: &[Tensor; 4], outputs: [Tensor; 3], t: u64) -> AdamOptimizerDesc {
        AdamOptimizerDesc {
            input_parameters_tensor: inputs[0].clone(),
            input_first_moment_tensor: inputs[1].clone(),
            input_second_moment_tensor: inputs[2].clone(),
            gradient_tensor: inputs[3].clone(),
            training_step_tensor: TrainingStep::Integer(t),
            output_parameters_tensor: outputs[0].clone(),
            output_first_moment_tensor: outputs[1].clone(),
            output_second_moment_tensor: outputs[2].clone(),
            scalars: DML,
        }
    }
}

#[test]
fn directml_every_output_in_place_or_not_in_every_combination() {
    let ctx = ctx();
    for mask in 0..8u32 {
        let case = DmlCase::new(1000 + mask as usize, u64::from(mask));
        let inputs = case.inputs(&ctx);
        let outputs: [Tensor; 3] = std::array::from_fn(|k| {
            if mask & (1 << k) != 0 {
                inputs[k].clone()
            } else {
                ctx.zeros("output", inputs[k].len, DType::F32)
            }
        });
        let desc = case.desc(&inputs, outputs.clone(), 3);
        ctx.submit("dml", |encoder| directml::adam(&ctx, encoder, &desc)).unwrap();
        let want = oracle::dml_adam(&DML.to_oracle(), 3, &case.p, &case.m, &case.v, &case.g);
        assert_tensor(&ctx, &format!("OutputParametersTensor (mask {mask:03b})"), &outputs[0], &want.0);
        assert_tensor(&ctx, &format!("OutputFirstMomentTensor (mask {mask:03b})"), &outputs[1], &want.1);
        assert_tensor(&ctx, &format!("OutputSecondMomentTensor (mask {mask:03b})"), &outputs[2], &want.2);
    }
}

#[test]
fn directml_an_output_may_alias_a_different_input_of_the_same_size() {
    // OutputParametersTensor written over GradientTensor: every input of an element is read
    // before any output of it is written, so this is as well defined as in-place.
    let ctx = ctx();
    let case = DmlCase::new(777, 9);
    let inputs = case.inputs(&ctx);
    let outputs = [inputs[3].clone(), inputs[1].clone(), inputs[2].clone()];
    let desc = case.desc(&inputs, outputs, 2);
    ctx.submit("dml", |encoder| directml::adam(&ctx, encoder, &desc)).unwrap();
    let want = oracle::dml_adam(&DML.to_oracle(), 2, &case.p, &case.m, &case.v, &case.g);
    assert_tensor(&ctx, "parameters written over the gradient", &inputs[3], &want.0);
    assert_tensor(&ctx, "parameters input left alone", &inputs[0], &case.p);
}

#[test]
fn directml_training_step_zero_is_refused_with_the_reason() {
    let ctx = ctx();
    let case = DmlCase::new(16, 1);
    let inputs = case.inputs(&ctx);
    let mut desc = case.desc(&inputs, [inputs[0].clone(), inputs[1].clone(), inputs[2].clone()], 0);
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let err = directml::adam(&ctx, &mut encoder, &desc).unwrap_err();
    assert!(matches!(err, Error::BadStep { problem: wgpu_optim::StepProblem::Zero, .. }), "{err}");
    assert!(err.to_string().contains("0/0"), "the message explains the 0/0: {err}");
    desc.training_step_tensor = TrainingStep::Float(2.5);
    let err = directml::adam(&ctx, &mut encoder, &desc).unwrap_err();
    assert!(matches!(err, Error::BadStep { problem: wgpu_optim::StepProblem::NotWhole, .. }), "{err}");
    assert!(err.to_string().contains("whole number"), "{err}");
    desc.training_step_tensor = TrainingStep::Float(3.0);
    directml::adam(&ctx, &mut encoder, &desc).expect("a float holding a whole number is accepted");
}

fn adam_io(param: &Tensor, grad: &Tensor, m: &Tensor, v: &Tensor) -> Update {
    Update::in_place(param, grad, &[m.clone(), v.clone()])
}

/// Asserts the call is refused, and that the buffer is untouched after submitting the
/// encoder the refused call was given.
fn assert_refused(ctx: &GpuContext, io: Update, check: impl Fn(&Error) -> bool, watched: &Tensor) {
    let before = ctx.read_bytes(watched).unwrap();
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let err = ops::update(ctx, &mut encoder, &Adam::default().into(), 1, &[io]).unwrap_err();
    assert!(check(&err), "unexpected error: {err}");
    ctx.queue().submit([encoder.finish()]);
    assert_eq!(ctx.read_bytes(watched).unwrap(), before, "a refused call changed memory ({err})");
}

#[test]
fn a_partial_overlap_is_a_typed_error_and_records_nothing() {
    let ctx = ctx();
    // Four 16-element tensors 32 elements apart.
    let buffer = ctx.upload_f32("shared", &[0.5; 128]);
    let t = |k: u64| Tensor { buffer: buffer.buffer.clone(), offset: 128 * k, len: 16, dtype: DType::F32 };
    let (param, grad, m, v) = (t(0), t(1), t(2), t(3));
    // The new parameters start 4 elements into the gradient.
    let mut io = adam_io(&param, &grad, &m, &v);
    io.param_out =
        Some(Tensor { buffer: buffer.buffer.clone(), offset: 128 + 16, len: 16, dtype: DType::F32 });
    assert_refused(
        &ctx,
        io,
        |e| matches!(e, Error::PartialOverlap { output, other } if output == "updates[0].param_out" && other == "updates[0].grad"),
        &buffer,
    );
    // Two outputs whose ranges overlap partially.
    let mut io = adam_io(&param, &grad, &m, &v);
    io.state_out[0] = Some(Tensor { buffer: buffer.buffer.clone(), offset: 32, len: 16, dtype: DType::F32 });
    assert_refused(&ctx, io, |e| matches!(e, Error::PartialOverlap { .. }), &buffer);
}

#[test]
fn two_outputs_on_one_range_is_a_typed_error() {
    let ctx = ctx();
    let buffer = ctx.upload_f32("shared", &[0.5; 64]);
    let t = |k: u64| Tensor { buffer: buffer.buffer.clone(), offset: 64 * k, len: 16, dtype: DType::F32 };
    let mut io = adam_io(&t(0), &t(1), &t(2), &t(3));
    io.state_out[0] = Some(t(3)); // the new first moment onto the second moment's range
    assert_refused(&ctx, io, |e| matches!(e, Error::OutputsAlias { .. }), &buffer);
}

#[test]
fn a_length_mismatch_is_a_typed_error() {
    let ctx = ctx();
    let p = ctx.upload_f32("p", &[0.5; 16]);
    let g = ctx.upload_f32("g", &[0.5; 15]);
    let m = ctx.zeros("m", 16, DType::F32);
    let v = ctx.zeros("v", 16, DType::F32);
    assert_refused(
        &ctx,
        adam_io(&p, &g, &m, &v),
        |e| matches!(e, Error::LengthMismatch { got: 15, expected: 16, .. }),
        &p,
    );
}

#[test]
fn params_and_grads_in_one_buffer_at_unaligned_offsets_train_correctly() {
    // A trainer that packs parameters and gradients into one buffer binds it read-write
    // twice; wgpu would refuse a read-only gradient binding of the same buffer. Offsets of
    // 7 and 1013 elements are multiples of no adapter's binding alignment.
    let ctx = ctx();
    let mut rng = Rng::new(11);
    let n = 1000;
    let p0 = rng.vec(n, 1.0);
    let mut packed = vec![0.0f32; 2100];
    packed[7..7 + n].copy_from_slice(&to_f32(&p0));
    let buffer = ctx.upload_f32("params+grads", &packed);
    let param = Tensor { buffer: buffer.buffer.clone(), offset: 7 * 4, len: n as u64, dtype: DType::F32 };
    let grad = Tensor { buffer: buffer.buffer.clone(), offset: 1013 * 4, len: n as u64, dtype: DType::F32 };
    let config = Adam { lr: 0.01, amsgrad: true, ..Adam::default() };
    let mut optimizer = Optimizer::builder().build(&ctx, config, std::slice::from_ref(&param)).unwrap();
    let mut p = p0.clone();
    let mut state = TorchAdamState::zeros(n, true);
    for _ in 0..30 {
        let g = rng.vec(n, 1.0);
        ctx.write_bytes(&grad, bytemuck::cast_slice(&to_f32(&g))).unwrap();
        optimizer.step(std::slice::from_ref(&grad)).unwrap();
        torch_adam_step(&config.to_oracle(), &mut p, &g, &mut state);
    }
    assert_tensor(&ctx, "packed param", &param, &p);
    assert_tensor(
        &ctx,
        "exp_avg",
        optimizer.state(0, StateKind::ExpAvg).unwrap().and_then(|s| s.dense()).unwrap(),
        &state.exp_avg,
    );
    let untouched = Tensor { buffer: buffer.buffer.clone(), offset: 0, len: 7, dtype: DType::F32 };
    assert_tensor(&ctx, "elements before the parameters", &untouched, &[0.0; 7]);
}

#[test]
fn the_optimizer_refuses_grads_that_do_not_match() {
    let ctx = ctx();
    let params = vec![ctx.upload_f32("p", &[0.5; 16]), ctx.upload_f32("q", &[0.5; 8])];
    let mut optimizer = Optimizer::builder().build(&ctx, Adam::default(), &params).unwrap();
    let err = optimizer.step(&params[..1]).unwrap_err();
    assert!(matches!(err, Error::CountMismatch { got: 1, expected: 2, .. }), "{err}");
    let grads = vec![ctx.zeros("g", 16, DType::F32), ctx.zeros("h", 9, DType::F32)];
    let err = optimizer.step(&grads).unwrap_err();
    assert!(
        matches!(&err, Error::LengthMismatch { argument, got: 9, expected: 8, .. } if argument == "grads[1]"),
        "{err}"
    );
    assert_eq!(optimizer.step_count(), 0, "a refused step does not count");
    assert_tensor(&ctx, "params after refused steps", &params[0], &[0.5; 16]);
}

/// Every byte of `tensors`' buffers, to show that a refused step wrote nothing.
fn buffer_bytes(ctx: &GpuContext, tensors: &[&Tensor]) -> Vec<Vec<u8>> {
    tensors
        .iter()
        .map(|t| {
            ctx.read_bytes(&Tensor {
                buffer: t.buffer.clone(),
                offset: 0,
                len: t.buffer.size() / 4,
                dtype: DType::F32,
            })
            .unwrap()
        })
        .collect()
}

/// Asserts that a step over `grads` is refused as a gradient overlapping `written`, with
/// nothing recorded into the encoder it was given and the step count unchanged.
#[track_caller]
fn assert_grads_refused(
    ctx: &GpuContext,
    optimizer: &mut Optimizer,
    grads: &[Tensor],
    watched: &[&Tensor],
    (grad, written): (&str, &str),
) {
    let before = buffer_bytes(ctx, watched);
    let step = optimizer.step_count();
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let err = optimizer.record_step(&mut encoder, grads).unwrap_err();
    ctx.queue().submit([encoder.finish()]);
    assert!(
        matches!(&err, Error::OverlapsWritten { tensor, written: w } if tensor == grad && w == written),
        "expected `{grad}` refused for overlapping `{written}`, got: {err}"
    );
    assert!(err.to_string().contains(grad) && err.to_string().contains(written), "{err}");
    let err = optimizer.step(grads).unwrap_err();
    assert!(matches!(err, Error::OverlapsWritten { .. }), "step() refuses too: {err}");
    assert_eq!(optimizer.step_count(), step, "a refused step does not count");
    assert!(buffer_bytes(ctx, watched) == before, "a refused step changed memory ({err})");
}

#[test]
fn a_gradient_inside_another_parameter_is_refused_and_changes_nothing() {
    // Two parameters of 1000 in one buffer; grads[1] lies inside params[0]. Updated in one
    // pass, grads[1] would read params[0]'s new values.
    let ctx = ctx();
    let n = 1000;
    let mut rng = Rng::new(31);
    let initial = rng.vec(2 * n, 1.0);
    let flat = ctx.upload_f32("params", &to_f32(&initial));
    let params = [flat.slice(0, n as u64), flat.slice(n as u64, n as u64)];
    let config = Adam { lr: 0.01, ..Adam::default() };
    let mut optimizer = Optimizer::builder().build(&ctx, config, &params).unwrap();
    let g0 = ctx.upload_f32("g0", &to_f32(&rng.vec(n, 1.0)));
    let exp_avg = optimizer.state(0, StateKind::ExpAvg).unwrap().and_then(|s| s.dense()).unwrap().clone();
    let watched = [&flat, &g0, &exp_avg];
    let inside = [g0.clone(), params[0].clone()];
    assert_grads_refused(&ctx, &mut optimizer, &inside, &watched, ("grads[1]", "params[0]"));
    // Partly inside: from the middle of params[0] into params[1].
    let straddling = [g0.clone(), flat.slice(500, n as u64)];
    assert_grads_refused(&ctx, &mut optimizer, &straddling, &watched, ("grads[1]", "params[0]"));
    // A gradient that is another tensor's state, exactly.
    let state = [exp_avg.clone(), ctx.zeros("g1", n as u64, DType::F32)];
    assert_grads_refused(&ctx, &mut optimizer, &state, &watched, ("grads[0]", "exp_avg[0]"));

    // Each gradient its own parameter exactly is allowed, and steps as PyTorch does.
    let own = params.clone();
    optimizer.step(&own).unwrap();
    let mut want = initial.clone();
    for half in 0..2 {
        let range = half * n..(half + 1) * n;
        let mut state = TorchAdamState::zeros(n, false);
        let grad = initial[range.clone()].to_vec();
        torch_adam_step(&config.to_oracle(), &mut want[range], &grad, &mut state);
    }
    assert_tensor(&ctx, "params after a step on their own values", &flat, &want);
}

#[test]
fn a_gradient_inside_another_parameter_is_refused_with_8bit_state() {
    let ctx = ctx();
    // params[0] of 8192 and params[1] of 4096 in one buffer, both with 8-bit state.
    let n = 4096;
    let mut rng = Rng::new(32);
    let flat = ctx.upload_f32("params", &to_f32(&rng.vec(3 * n, 1.0)));
    let params = [flat.slice(0, 2 * n as u64), flat.slice(2 * n as u64, n as u64)];
    let options = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
    let mut optimizer = options.build(&ctx, Adam::adamw(), &params).unwrap();
    let g0 = ctx.upload_f32("g0", &to_f32(&rng.vec(2 * n, 1.0)));
    optimizer.step(&[g0.clone(), ctx.upload_f32("g1", &to_f32(&rng.vec(n, 1.0)))]).unwrap();
    let states = |o: &Optimizer| {
        (0..2)
            .map(|i| o.state(i, StateKind::ExpAvg).map(|s| s.and_then(|v| v.q8())).unwrap())
            .collect::<Vec<_>>()
    };
    let before = states(&optimizer);
    // grads[1] inside params[0], clear of params[1].
    let grads = [g0.clone(), flat.slice(100, n as u64)];
    assert_grads_refused(&ctx, &mut optimizer, &grads, &[&flat, &g0], ("grads[1]", "params[0]"));
    assert_eq!(states(&optimizer), before, "a refused step changed the 8-bit state");
}

#[test]
fn a_gradient_overlapping_a_model_copy_is_refused() {
    let ctx = ctx();
    let n = 64;
    let params = [ctx.upload_f32("p0", &[0.5; 64]), ctx.upload_f32("p1", &[0.25; 64])];
    // The bf16 copies in one buffer, 128 bytes each, at bytes 0 and 768.
    let copies = ctx.zeros("copies", 8 * n, DType::BF16);
    let options = Optimizer::builder().model_copies(vec![copies.slice(0, n), copies.slice(6 * n, n)]);
    let mut optimizer = options.build(&ctx, Adam::default(), &params).unwrap();
    // An f32 gradient (bytes 64 to 320) over the second half of copy 0 and nothing else.
    let grads = [
        ctx.upload_f32("g0", &[0.1; 64]),
        Tensor { buffer: copies.buffer.clone(), offset: 64, len: n, dtype: DType::F32 },
    ];
    let watched = [&params[0], &params[1], &copies];
    assert_grads_refused(&ctx, &mut optimizer, &grads, &watched, ("grads[1]", "model_copies[0]"));
}

#[test]
fn an_input_of_one_update_inside_another_updates_output_is_refused() {
    // ops::update runs all its updates in one pass, as the optimizer does.
    let ctx = ctx();
    let flat = ctx.upload_f32("params", &[0.5; 128]);
    let (p0, p1) = (flat.slice(0, 32), flat.slice(96, 32));
    let state = || ctx.zeros("state", 32, DType::F32);
    let (m0, v0, m1, v1) = (state(), state(), state(), state());
    let g0 = ctx.upload_f32("g0", &[0.1; 32]);
    let updates = [adam_io(&p0, &g0, &m0, &v0), adam_io(&p1, &flat.slice(8, 32), &m1, &v1)];
    let before = ctx.read_bytes(&flat).unwrap();
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let err = ops::update(&ctx, &mut encoder, &Adam::default().into(), 1, &updates).unwrap_err();
    ctx.queue().submit([encoder.finish()]);
    assert!(
        matches!(&err, Error::OverlapsWritten { tensor, written } if tensor == "updates[1].grad" && written == "updates[0].param"),
        "{err}"
    );
    assert_eq!(ctx.read_bytes(&flat).unwrap(), before, "a refused call changed memory");

    // ONNX's variadic Adam: G_2 inside X_1, which is updated in place.
    let inputs = [p0.clone(), p1.clone(), g0.clone(), flat.slice(4, 32), m0, m1, v0, v1];
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let attributes = wgpu_optim::OnnxAdam::default();
    let err = ops::onnx::adam(&ctx, &mut encoder, &attributes, 0.01, 1, &inputs, &vec![None; 6]).unwrap_err();
    ctx.queue().submit([encoder.finish()]);
    assert!(
        matches!(&err, Error::OverlapsWritten { tensor, written } if tensor == "G_2" && written == "X_1"),
        "{err}"
    );
    assert_eq!(ctx.read_bytes(&flat).unwrap(), before, "a refused call changed memory");
}

#[test]
fn read_bytes_many_reads_every_view_as_read_bytes_does_in_one_copy() {
    let ctx = ctx();
    // f16 views starting and ending inside 4-byte words, an empty one, and an f32 tensor of
    // another buffer.
    let halves: Vec<f64> = (0..37).map(|i| f64::from(i) * 0.5 - 3.0).collect();
    let flat = ctx.upload("halves", &halves, DType::F16);
    let other = ctx.upload_f32("other", &[1.5, -2.25, 3.0]);
    let tensors =
        vec![flat.slice(1, 5), flat.slice(6, 0), flat.slice(7, 30), other.clone(), flat.slice(0, 2)];
    let many = ctx.read_bytes_many(&tensors).unwrap();
    assert_eq!(many.len(), tensors.len());
    for (i, (bytes, tensor)) in many.iter().zip(&tensors).enumerate() {
        assert_eq!(*bytes, ctx.read_bytes(tensor).unwrap(), "tensors[{i}]");
        assert_eq!(bytes.len() as u64, tensor.byte_len(), "tensors[{i}]");
    }
    let decoded: Vec<f64> =
        many[0].chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64()).collect();
    assert_eq!(decoded, halves[1..6].to_vec());
    let unreadable = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let refused = ctx.read_bytes_many(&[other, Tensor::whole(&unreadable, DType::F32).unwrap()]);
    match refused {
        Err(Error::MissingUsage { argument, needed, .. }) => {
            assert_eq!((argument.as_str(), needed), ("tensors[1]", "COPY_SRC"));
        }
        other => panic!("expected the tensor without COPY_SRC refused, got {other:?}"),
    }
}
