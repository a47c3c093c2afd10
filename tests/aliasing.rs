//! DirectML's binding rule on the GPU: every output may alias its input exactly, or any
//! other input exactly; a partial overlap or two outputs on one range is a typed error
//! before anything is recorded. Also tensors that share one buffer at unaligned offsets.

mod common;

use common::{assert_tensor, ctx, to_f32, Rng};
use wgpu_optim::ops::directml::{self, AdamOptimizerDesc, TrainingStep};
use wgpu_optim::ops::{self, Update};
use wgpu_optim::oracle::{self, torch_adam_step, TorchAdamState};
use wgpu_optim::{Adam, DType, DmlAdam, Error, GpuContext, Optimizer, StateKind, Tensor};

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
        let want = oracle::dml_adam(&DML, 3, &case.p, &case.m, &case.v, &case.g);
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
    let want = oracle::dml_adam(&DML, 2, &case.p, &case.m, &case.v, &case.g);
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
    assert!(matches!(err, Error::BadStep(_)), "{err}");
    assert!(err.to_string().contains("0/0"), "the message explains the 0/0: {err}");
    desc.training_step_tensor = TrainingStep::Float(2.5);
    let err = directml::adam(&ctx, &mut encoder, &desc).unwrap_err();
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
    let t = |k: u64| Tensor::new(&buffer.buffer, 128 * k, 16, DType::F32);
    let (param, grad, m, v) = (t(0), t(1), t(2), t(3));
    // The new parameters start 4 elements into the gradient.
    let mut io = adam_io(&param, &grad, &m, &v);
    io.param_out = Some(Tensor::new(&buffer.buffer, 128 + 16, 16, DType::F32));
    assert_refused(
        &ctx,
        io,
        |e| matches!(e, Error::PartialOverlap { output, other } if output == "updates[0].param_out" && other == "updates[0].grad"),
        &buffer,
    );
    // Two outputs whose ranges overlap partially.
    let mut io = adam_io(&param, &grad, &m, &v);
    io.state_out[0] = Some(Tensor::new(&buffer.buffer, 32, 16, DType::F32));
    assert_refused(&ctx, io, |e| matches!(e, Error::PartialOverlap { .. }), &buffer);
}

#[test]
fn two_outputs_on_one_range_is_a_typed_error() {
    let ctx = ctx();
    let buffer = ctx.upload_f32("shared", &[0.5; 64]);
    let t = |k: u64| Tensor::new(&buffer.buffer, 64 * k, 16, DType::F32);
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
    let param = Tensor::new(&buffer.buffer, 7 * 4, n as u64, DType::F32);
    let grad = Tensor::new(&buffer.buffer, 1013 * 4, n as u64, DType::F32);
    let config = Adam { lr: 0.01, amsgrad: true, ..Adam::default() };
    let mut optimizer = Optimizer::new(&ctx, config, std::slice::from_ref(&param)).unwrap();
    let mut p = p0.clone();
    let mut state = TorchAdamState::zeros(n, true);
    for _ in 0..30 {
        let g = rng.vec(n, 1.0);
        ctx.write_bytes(&grad, bytemuck::cast_slice(&to_f32(&g))).unwrap();
        optimizer.step(std::slice::from_ref(&grad)).unwrap();
        torch_adam_step(&config, &mut p, &g, &mut state);
    }
    assert_tensor(&ctx, "packed param", &param, &p);
    assert_tensor(&ctx, "exp_avg", optimizer.state(0, StateKind::ExpAvg).unwrap(), &state.exp_avg);
    let untouched = Tensor::new(&buffer.buffer, 0, 7, DType::F32);
    assert_tensor(&ctx, "elements before the parameters", &untouched, &[0.0; 7]);
}

#[test]
fn the_optimizer_refuses_grads_that_do_not_match() {
    let ctx = ctx();
    let params = vec![ctx.upload_f32("p", &[0.5; 16]), ctx.upload_f32("q", &[0.5; 8])];
    let mut optimizer = Optimizer::new(&ctx, Adam::default(), &params).unwrap();
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
