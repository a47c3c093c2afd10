//! Every public entry refuses bad input with a typed error that names the argument, and a
//! refused call changes nothing: every buffer involved and the optimizer's state (its
//! checkpoint bytes and step count) are compared before and after.

use crate::common;

use std::collections::BTreeMap;

use common::{ctx, fresh_ctx};
use wgpu_optim::cpu::CpuOptimizer;
use wgpu_optim::ops::directml::{self, AdamOptimizerDesc, TrainingStep};
use wgpu_optim::ops::{self, onnx, Update};
use wgpu_optim::{
    Adagrad, Adam, DType, DmlAdam, Error, GpuContext, MomentumMode, OnnxAdam, OnnxMomentum, Optimizer,
    ParamGroup, Sgd, StateStorage, Tensor, TENSOR_USAGES,
};

/// The name of an error's variant, for the tally (its `Debug` name, so that a new variant
/// needs no entry here).
fn kind(error: &Error) -> String {
    format!("{error:?}").chars().take_while(|c| c.is_ascii_alphanumeric()).collect()
}

/// Fixtures shared by the cases: an optimizer and the tensors of stateless calls.
struct World {
    ctx: GpuContext,
    optimizer: Optimizer,
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
    /// Tensors of a stateless Adam call: p, g, m, v, and spare outputs.
    t: Vec<Tensor>,
    tally: BTreeMap<String, usize>,
}

impl World {
    fn new() -> Self {
        let ctx = ctx();
        let params = vec![ctx.upload("p", &[0.5; 16], DType::F32), ctx.upload("q", &[0.25; 7], DType::F32)];
        let grads = vec![ctx.upload("g", &[0.1; 16], DType::F32), ctx.upload("h", &[0.2; 7], DType::F32)];
        let mut optimizer =
            Optimizer::builder().build(&ctx, Adam { amsgrad: true, ..Adam::default() }, &params).unwrap();
        optimizer.step(&grads).unwrap();
        let t = (0..6).map(|k| ctx.upload("t", &[0.1 * k as f64; 16], DType::F32)).collect();
        World { ctx, optimizer, params, grads, t, tally: BTreeMap::new() }
    }

    /// Everything a refused call could have changed.
    fn snapshot(&self) -> (Vec<Vec<u8>>, Vec<u8>, u64) {
        let buffers =
            self.params.iter().chain(&self.grads).chain(&self.t).map(|t| self.ctx.read_bytes(t).unwrap());
        let mut checkpoint = self.optimizer.save_to_bytes().unwrap();
        // The metadata map has no fixed order; the tensor data after the header does.
        let header = u64::from_le_bytes(checkpoint[..8].try_into().unwrap()) as usize;
        checkpoint.drain(..8 + header);
        (buffers.collect(), checkpoint, self.optimizer.step_count())
    }

    /// Runs a call that must be refused with `expected`, naming `argument` in its message,
    /// and checks that nothing changed.
    fn refuse(
        &mut self,
        expected: &'static str,
        argument: &str,
        call: impl FnOnce(&mut World) -> wgpu_optim::Result<()>,
    ) {
        let before = self.snapshot();
        let err = call(self).expect_err(&format!("a {expected} call naming `{argument}` was accepted"));
        self.ctx.queue().submit([]);
        assert_eq!(kind(&err), expected, "{err}");
        assert!(err.to_string().contains(argument), "the message should name `{argument}`: {err}");
        assert!(self.snapshot() == before, "a refused call ({err}) changed a buffer or the optimizer");
        *self.tally.entry(expected.to_string()).or_default() += 1;
    }

    fn adam_io(&self) -> Update {
        Update::in_place(&self.t[0], &self.t[1], &self.t[2..4])
    }

    /// Records into a throwaway encoder that is submitted, so that anything recorded before
    /// a refusal would show.
    fn record(
        &self,
        f: impl FnOnce(&mut wgpu::CommandEncoder) -> wgpu_optim::Result<()>,
    ) -> wgpu_optim::Result<()> {
        let mut encoder = self.ctx.device().create_command_encoder(&Default::default());
        let result = f(&mut encoder);
        self.ctx.queue().submit([encoder.finish()]);
        result
    }
}

#[test]
fn every_bad_input_is_refused_with_a_typed_error_and_changes_nothing() {
    let mut w = World::new();
    let f16 = w.ctx.upload("f16", &[0.5; 16], DType::F16);
    let short = w.ctx.upload("short", &[0.5; 15], DType::F32);
    let f64_tensor = w.ctx.upload("f64", &[0.5; 16], DType::F64);

    // Lengths and counts.
    w.refuse("LengthMismatch", "grads[1]", |w| {
        let grads = [w.grads[0].clone(), w.grads[0].slice(0, 8)];
        w.optimizer.step(&grads)
    });
    w.refuse("LengthMismatch", "grad", |w| {
        let mut io = w.adam_io();
        io.grad = short.clone();
        w.record(|e| ops::update(&w.ctx, e, &Adam::default().into(), 1, &[io]))
    });
    w.refuse("LengthMismatch", "V_1", |w| {
        let inputs = [w.t[0].clone(), w.t[1].clone(), short.clone(), w.t[3].clone()];
        w.record(|e| onnx::adam(&w.ctx, e, &OnnxAdam::default(), 0.1, 1, &inputs, &[None, None, None]))
    });
    w.refuse("CountMismatch", "grads", |w| {
        let grads = w.grads[..1].to_vec();
        w.optimizer.step(&grads)
    });
    w.refuse("CountMismatch", "inputs", |w| {
        let inputs = w.t[..3].to_vec();
        w.record(|e| onnx::adam(&w.ctx, e, &OnnxAdam::default(), 0.1, 1, &inputs, &[None, None, None]))
    });
    w.refuse("CountMismatch", "outputs", |w| {
        let inputs = w.t[..4].to_vec();
        w.record(|e| onnx::adam(&w.ctx, e, &OnnxAdam::default(), 0.1, 1, &inputs, &[None]))
    });
    w.refuse("CountMismatch", "max_exp_avg_sq", |w| {
        let io = w.adam_io();
        w.record(|e| ops::update(&w.ctx, e, &Adam { amsgrad: true, ..Adam::default() }.into(), 1, &[io]))
    });
    w.refuse("CountMismatch", "state", |w| {
        let update = Update::in_place(&w.t[0], &w.t[1], &w.t[2..3]);
        w.record(|e| ops::update(&w.ctx, e, &Adam::default().into(), 1, &[update]))
    });

    // Dtypes.
    w.refuse("DTypeMismatch", "param_out", |w| {
        let mut io = w.adam_io();
        io.param_out = Some(f16.clone());
        w.record(|e| ops::update(&w.ctx, e, &Adam::default().into(), 1, &[io]))
    });
    w.refuse("DTypeMismatch", "G_1", |w| {
        let inputs = [f64_tensor.clone(), w.t[1].clone(), f64_tensor.clone()];
        let momentum =
            OnnxMomentum { alpha: 0.9, beta: 1.0, mode: MomentumMode::Standard, norm_coefficient: 0.0 };
        w.record(|e| {
            onnx::momentum(
                &w.ctx,
                e,
                &momentum,
                0.1,
                1,
                &inputs,
                &[Some(w.t[4].clone()), Some(w.t[5].clone())],
            )
        })
    });
    w.refuse("DTypeMismatch", "state_storage", |w| {
        let options = Optimizer::builder().state_storage(StateStorage::Dtype(DType::F64));
        options.build(&w.ctx, Adam::default(), &w.params).map(drop)
    });

    // Ranges and usages.
    w.refuse("BadRange", "grad", |w| {
        let mut io = w.adam_io();
        io.grad = Tensor { buffer: w.t[1].buffer.clone(), offset: 2, len: 15, dtype: DType::F32 };
        w.record(|e| ops::update(&w.ctx, e, &Adam::default().into(), 1, &[io]))
    });
    w.refuse("BadRange", "exp_avg", |w| {
        let mut io = w.adam_io();
        io.state[0] = Tensor { buffer: w.t[2].buffer.clone(), offset: 8, len: 16, dtype: DType::F32 };
        w.record(|e| ops::update(&w.ctx, e, &Adam::default().into(), 1, &[io]))
    });
    let unbindable = w.ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("copy only"),
        size: 64,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    w.refuse("MissingUsage", "params[0]", |w| {
        Optimizer::builder()
            .build(&w.ctx, Adam::default(), &[Tensor::whole(&unbindable, DType::F32).unwrap()])
            .map(drop)
    });

    // Aliasing.
    w.refuse("PartialOverlap", "param_out", |w| {
        let mut io = w.adam_io();
        io.param_out = Some(
            Tensor { buffer: w.t[1].buffer.clone(), offset: 4, len: 15, dtype: DType::F32 }
                .slice(0, 16)
                .slice(0, 15),
        );
        io.grad = w.t[1].slice(0, 15);
        io.param = w.t[0].slice(0, 15);
        io.state[0] = w.t[2].slice(0, 15);
        io.state[1] = w.t[3].slice(0, 15);
        w.record(|e| ops::update(&w.ctx, e, &Adam::default().into(), 1, &[io]))
    });
    w.refuse("OutputsAlias", "exp_avg_out", |w| {
        let mut io = w.adam_io();
        io.state_out[0] = Some(w.t[3].clone());
        w.record(|e| ops::update(&w.ctx, e, &Adam::default().into(), 1, &[io]))
    });

    // Hyperparameters.
    let bad_adams = [
        ("lr", Adam { lr: f64::NAN, ..Adam::default() }),
        ("lr", Adam { lr: -1.0, ..Adam::default() }),
        ("beta1", Adam { beta1: 1.0, ..Adam::default() }),
        ("beta2", Adam { beta2: -0.1, ..Adam::default() }),
        ("eps", Adam { eps: -1e-8, ..Adam::default() }),
        ("eps", Adam { eps: f64::INFINITY, ..Adam::default() }),
        ("weight_decay", Adam { weight_decay: f64::NAN, ..Adam::default() }),
    ];
    for (name, adam) in bad_adams {
        w.refuse("BadHyperparameter", name, |w| {
            Optimizer::builder().build(&w.ctx, adam, &w.params).map(drop)
        });
        w.refuse("BadHyperparameter", name, |w| {
            let io = w.adam_io();
            w.record(|e| ops::update(&w.ctx, e, &adam.into(), 1, &[io]))
        });
    }
    w.refuse("BadHyperparameter", "lr", |w| w.optimizer.set_lr(f64::NAN));
    w.refuse("BadHyperparameter", "momentum", |w| {
        Optimizer::builder().build(&w.ctx, Sgd { nesterov: true, ..Sgd::default() }, &w.params).map(drop)
    });
    w.refuse("BadHyperparameter", "lr_decay", |w| {
        Optimizer::builder()
            .build(&w.ctx, Adagrad { lr_decay: -1.0, ..Adagrad::default() }, &w.params)
            .map(drop)
    });
    w.refuse("BadHyperparameter", "alpha", |w| {
        let inputs = w.t[..4].to_vec();
        w.record(|e| {
            onnx::adam(
                &w.ctx,
                e,
                &OnnxAdam { alpha: 1.0, ..OnnxAdam::default() },
                0.1,
                3,
                &inputs,
                &[None, None, None],
            )
        })
    });
    w.refuse("BadHyperparameter", "R", |w| {
        let inputs = w.t[..4].to_vec();
        w.record(|e| onnx::adam(&w.ctx, e, &OnnxAdam::default(), f64::NAN, 3, &inputs, &[None, None, None]))
    });

    // Steps.
    let dml = |w: &World, step: TrainingStep| AdamOptimizerDesc {
        input_parameters_tensor: w.t[0].clone(),
        input_first_moment_tensor: w.t[2].clone(),
        input_second_moment_tensor: w.t[3].clone(),
        gradient_tensor: w.t[1].clone(),
        training_step_tensor: step,
        output_parameters_tensor: w.t[0].clone(),
        output_first_moment_tensor: w.t[2].clone(),
        output_second_moment_tensor: w.t[3].clone(),
        scalars: DmlAdam { learning_rate: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 },
    };
    for step in [
        TrainingStep::Integer(0),
        TrainingStep::Float(0.0),
        TrainingStep::Float(2.5),
        TrainingStep::Float(f64::NAN),
    ] {
        w.refuse("BadStep", "TrainingStepTensor", |w| {
            let desc = dml(w, step);
            w.record(|e| directml::adam(&w.ctx, e, &desc))
        });
    }
    w.refuse("BadHyperparameter", "Beta1", |w| {
        let mut desc = dml(w, TrainingStep::Integer(1));
        desc.scalars.beta1 = 1.0;
        w.record(|e| directml::adam(&w.ctx, e, &desc))
    });
    w.refuse("BadStep", "step 0", |w| {
        let io = w.adam_io();
        w.record(|e| ops::update(&w.ctx, e, &Adam::default().into(), 0, &[io]))
    });

    // Features and modes.
    w.refuse("NeedsOption", "capturable", |w| {
        let grads = w.grads.clone();
        let inv_scale = w.ctx.upload("inv_scale", &[1.0], DType::F32);
        let mut encoder = w.ctx.device().create_command_encoder(&Default::default());
        let result = w.optimizer.record_unscale(&mut encoder, &grads, &inv_scale);
        w.ctx.queue().submit([encoder.finish()]);
        result
    });

    w.refuse("ConflictingOptions", "model_copies", |w| {
        let options =
            Optimizer::builder().master_weights(true).model_copies(vec![w.t[4].clone(), w.t[5].clone()]);
        options.build(&w.ctx, Adam::default(), &w.params).map(drop)
    });
    w.refuse("NoSuchGroup", "group 2", |w| w.optimizer.set_group_lr(2, 0.1));
    w.refuse("StateMismatch", "max_exp_avg_sq", |w| w.optimizer.set_group_algorithm(0, Adam::default()));

    // Files.
    for bytes in [&b""[..], b"not a checkpoint", &[0xff; 64]] {
        w.refuse("BadFile", "checkpoint", |w| w.optimizer.load_from_bytes(bytes));
    }

    let total: usize = w.tally.values().sum();
    eprintln!("bad inputs refused, by kind ({total} in all):");
    for (kind, count) in &w.tally {
        eprintln!("  {kind:<18} {count}");
    }
    assert!(total >= 40, "only {total} bad inputs were tried");
}

/// An f16 tensor whose last element ends in the middle of the buffer's last word: storage
/// bindings and copies cover whole 4-byte words, so every entry refuses it up front (not the
/// first step, and not wgpu's copy validation).
#[test]
fn a_tensor_that_ends_inside_its_buffers_last_word_is_refused_by_every_entry() {
    let mut w = World::new();
    let buffer = w.ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("4097 halves, exactly sized"),
        size: 8194,
        usage: TENSOR_USAGES,
        mapped_at_creation: false,
    });
    let odd = Tensor { buffer: buffer.clone(), offset: 0, len: 4097, dtype: DType::F16 };
    w.refuse("BadRange", "params[0]", |w| {
        Optimizer::builder().build(&w.ctx, Adam::default(), std::slice::from_ref(&odd)).map(drop)
    });
    w.refuse("BadRange", "params[2]", |w| {
        let groups = vec![
            ParamGroup::new(Adam::default(), &w.params),
            ParamGroup::new(Sgd::default(), std::slice::from_ref(&odd)),
        ];
        Optimizer::builder().build_groups(&w.ctx, groups).map(drop)
    });
    w.refuse("BadRange", "model_copies[0]", |w| {
        let masters = [w.ctx.zeros("master", 4097, DType::F32)];
        let options = Optimizer::builder().model_copies(vec![odd.clone()]);
        options.build(&w.ctx, Adam::default(), &masters).map(drop)
    });
    w.refuse("BadRange", "model_params[0]", |w| {
        Optimizer::builder()
            .master_weights(true)
            .build(&w.ctx, Adam::default(), std::slice::from_ref(&odd))
            .map(drop)
    });
    w.refuse("BadRange", "tensor", |w| w.ctx.read(&odd).map(drop));
    w.refuse("BadRange", "tensor", |w| w.ctx.read_bytes(&odd.slice(4095, 2)).map(drop));
    // The same tensor one element shorter ends on a word boundary and is accepted.
    let even = odd.slice(0, 4096);
    Optimizer::builder()
        .master_weights(true)
        .build(&w.ctx, Adam::default(), std::slice::from_ref(&even))
        .unwrap();
    assert_eq!(w.ctx.read(&even).unwrap().len(), 4096);
}

/// Two parameters that share memory would be updated twice per step, each time with its own
/// state; an empty parameter list is a mistake. Both are refused, whatever the grouping.
#[test]
fn parameters_that_share_memory_and_empty_parameter_lists_are_refused() {
    let mut w = World::new();
    let (p, q) = (w.params[0].clone(), w.params[1].clone());
    let adam = || Adam::default();
    w.refuse("OverlappingParams", "params[1]", |w| {
        Optimizer::builder().build(&w.ctx, adam(), &[p.clone(), p.clone()]).map(drop)
    });
    w.refuse("OverlappingParams", "params[2]", |w| {
        Optimizer::builder().build(&w.ctx, adam(), &[p.clone(), q.clone(), p.slice(3, 4)]).map(drop)
    });
    w.refuse("OverlappingParams", "params[0]", |w| {
        // Reversed order: the slice comes first, the whole tensor second.
        Optimizer::builder().build(&w.ctx, adam(), &[p.slice(15, 1), q.clone(), p.clone()]).map(drop)
    });
    w.refuse("OverlappingParams", "params[2]", |w| {
        let groups = vec![
            ParamGroup::new(adam(), std::slice::from_ref(&p)),
            ParamGroup::new(Sgd::default(), &[q.clone(), p.slice(8, 8)]),
        ];
        Optimizer::builder().build_groups(&w.ctx, groups).map(drop)
    });
    let copies = w.ctx.zeros("copies", 32, DType::F16);
    let masters = [w.ctx.zeros("m0", 16, DType::F32), w.ctx.zeros("m1", 16, DType::F32)];
    w.refuse("OverlappingParams", "model_copies[1]", |w| {
        let options = Optimizer::builder().model_copies(vec![copies.slice(0, 16), copies.slice(14, 16)]);
        options.build(&w.ctx, adam(), &masters).map(drop)
    });
    w.refuse("OverlappingParams", "model_copies[1]", |w| {
        let options = Optimizer::builder().model_copies(vec![copies.slice(0, 16), masters[0].clone()]);
        options.build(&w.ctx, adam(), &masters).map(drop)
    });
    let model = w.ctx.upload("model", &[0.5; 16], DType::BF16);
    w.refuse("OverlappingParams", "model_params[1]", |w| {
        Optimizer::builder()
            .master_weights(true)
            .build(&w.ctx, adam(), &[model.clone(), model.clone()])
            .map(drop)
    });
    w.refuse("NoParameters", "params", |w| Optimizer::builder().build(&w.ctx, adam(), &[]).map(drop));
    w.refuse("NoParameters", "params", |w| {
        let groups = vec![ParamGroup::new(adam(), &[]), ParamGroup::new(Sgd::default(), &[])];
        Optimizer::builder().build_groups(&w.ctx, groups).map(drop)
    });
    w.refuse("NoParameters", "params", |w| Optimizer::builder().build_groups(&w.ctx, vec![]).map(drop));
    w.refuse("NoParameters", "model_params", |w| {
        Optimizer::builder().master_weights(true).build(&w.ctx, adam(), &[]).map(drop)
    });
    let err =
        CpuOptimizer::builder().build(adam(), &[]).expect_err("an empty CPU parameter list was accepted");
    assert_eq!(kind(&err), "NoParameters", "{err}");
    assert!(err.to_string().contains("params"), "{err}");

    // Disjoint ranges of one buffer, and an empty group beside a full one, are fine.
    let shared = w.ctx.zeros("shared", 32, DType::F32);
    let groups = vec![
        ParamGroup::new(adam(), &[shared.slice(0, 16)]),
        ParamGroup::new(Sgd::default(), &[]),
        ParamGroup::new(Sgd::default(), &[shared.slice(16, 16)]),
    ];
    let mut optimizer = Optimizer::builder().build_groups(&w.ctx, groups).unwrap();
    let grads = [w.ctx.upload("g", &[1.0; 16], DType::F32), w.ctx.upload("g", &[1.0; 16], DType::F32)];
    optimizer.step(&grads).unwrap();
    let after = w.ctx.read(&shared).unwrap();
    // Adam's first step moves by lr (1e-3) against the gradient; SGD's by lr * g (1e-3).
    assert!(after.iter().all(|&x| (x + 1e-3).abs() < 1e-9), "{after:?}");
}

#[test]
fn tensors_from_slices_bindings_and_whole_buffers_count_elements_not_bytes() {
    let ctx = ctx();
    let buffer = |size| {
        ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("t"),
            size,
            usage: TENSOR_USAGES,
            mapped_at_creation: false,
        })
    };
    let b64 = buffer(64);
    let t = Tensor::from_slice(b64.slice(8..24), DType::F16).unwrap();
    assert_eq!((t.offset, t.len), (8, 8));
    let binding = wgpu::BufferBinding { buffer: &b64, offset: 16, size: None };
    let t = Tensor::from_binding(&binding, DType::F32).unwrap();
    assert_eq!((t.offset, t.len), (16, 12));
    let binding = wgpu::BufferBinding { buffer: &b64, offset: 16, size: wgpu::BufferSize::new(6) };
    let err = Tensor::from_binding(&binding, DType::F32).unwrap_err();
    assert!(matches!(&err, Error::BadRange { argument, .. } if argument == "binding"), "{err}");
    let binding = wgpu::BufferBinding { buffer: &b64, offset: 68, size: None };
    assert!(matches!(Tensor::from_binding(&binding, DType::F32), Err(Error::BadRange { .. })));
    assert_eq!(Tensor::whole(&b64, DType::BF16).unwrap().len, 32);
    let b6 = buffer(6);
    let err = Tensor::whole(&b6, DType::F32).unwrap_err();
    assert!(err.to_string().contains("6 bytes are not a whole number of F32 elements"), "{err}");
    // Three halves fill the buffer, but the last word is incomplete: refused where it is used.
    let odd = Tensor::whole(&b6, DType::F16).unwrap();
    assert_eq!(odd.len, 3);
    let err = Optimizer::builder().build(&ctx, Adam::default(), &[odd]).unwrap_err();
    assert!(matches!(err, Error::BadRange { .. }), "{err}");
}

#[test]
fn a_lost_device_is_an_error_not_a_panic() {
    let ctx = fresh_ctx();
    let params = vec![ctx.upload("p", &[0.5; 8], DType::F32)];
    let grads = vec![ctx.upload("g", &[0.1; 8], DType::F32)];
    let mut optimizer = Optimizer::builder().build(&ctx, Adam::default(), &params).unwrap();
    optimizer.step(&grads).unwrap();
    ctx.device().destroy();
    // wgpu reports the loss once the queue is idle.
    let _ = ctx.device().poll(wgpu::PollType::wait_indefinitely());
    let err = optimizer.step(&grads).unwrap_err();
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");
    assert!(err.to_string().contains("checkpoint"), "the message says how to recover: {err}");
}
