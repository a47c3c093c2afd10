//! Every family and storage the careless-input checks run, and what each backend (and the
//! oracle) holds after a run: each tensor's parameter and states, as values (8-bit and
//! 4-bit states dequantized) and as stored bits.

use std::sync::{Arc, Mutex, OnceLock};

use wgpu_optim::cpu::{CpuOptimizer, CpuOptimizerBuilder, HostSlice, HostSliceMut};
use wgpu_optim::q4::{Q4State, Q4States};
use wgpu_optim::q8::{Q8States, StoredState};
use wgpu_optim::{
    adafactor_state_kinds, AdEMAMix, Adafactor, Adagrad, Adam, Adan, Adopt, Algorithm, DType, GpuContext,
    Lamb, Lion, Muon, Optimizer, OptimizerBuilder, ParamGroup, RmsProp, ScheduleFreeAdamW, Sgd, StateKind,
    StateStorage, Tensor,
};
use wgpu_optim_testkit::oracle::{ao4, bnb};

/// How a case keeps its states.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Storage {
    F32,
    Q8,
    Q4,
}

/// 8-bit state from 64 elements: the first tensor of [`shapes`] (96) is 8-bit, the others
/// keep f32 state.
pub const Q8: Q8States = Q8States { min_8bit_size: 64 };
/// 4-bit state in blocks of 32 from 64 elements: the same split as [`Q8`].
pub const Q4: Q4States = Q4States { block_size: 32, min_size: 64 };

/// A family's configuration and storage, named as the table in `docs/non-finite.md` names it.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    pub algorithm: Algorithm,
    pub storage: Storage,
}

impl Case {
    fn new(name: &'static str, algorithm: impl Into<Algorithm>, storage: Storage) -> Self {
        Case { name, algorithm: algorithm.into(), storage }
    }

    pub fn is_muon(&self) -> bool {
        matches!(self.algorithm, Algorithm::Muon(_))
    }

    /// The state kinds tensor `shape` keeps, in the algorithm's order.
    pub fn kinds(&self, shape: &[usize]) -> &'static [StateKind] {
        match self.algorithm {
            Algorithm::Adafactor(_) => adafactor_state_kinds(shape),
            _ => self.algorithm.state_kinds(),
        }
    }

    pub fn gpu(&self, shapes: &[Vec<usize>]) -> OptimizerBuilder {
        let builder = Optimizer::builder().param_shapes(shapes.to_vec());
        match self.storage {
            Storage::F32 => builder,
            Storage::Q8 => builder.state_storage(StateStorage::Q8(Q8)),
            Storage::Q4 => builder.state_storage(StateStorage::Q4(Q4)),
        }
    }

    pub fn cpu(&self, shapes: &[Vec<usize>]) -> CpuOptimizerBuilder {
        let builder = CpuOptimizer::builder().param_shapes(shapes.to_vec());
        match self.storage {
            Storage::F32 => builder,
            Storage::Q8 => builder.state_storage(StateStorage::Q8(Q8)),
            Storage::Q4 => builder.state_storage(StateStorage::Q4(Q4)),
        }
    }
}

/// Every family with f32 state, then those with 8-bit and 4-bit state.
pub fn cases() -> Vec<Case> {
    use Storage::*;
    let sgd = Sgd { lr: 0.01, ..Sgd::default() };
    vec![
        Case::new("Adam", Adam::default(), F32),
        Case::new("AdamW", Adam::adamw(), F32),
        Case::new("AMSGrad", Adam { amsgrad: true, ..Adam::default() }, F32),
        Case::new("SGD", sgd, F32),
        Case::new("SGD momentum", Sgd { momentum: 0.9, ..sgd }, F32),
        Case::new("SGD Nesterov", Sgd { momentum: 0.9, nesterov: true, ..sgd }, F32),
        Case::new("Adagrad", Adagrad::default(), F32),
        Case::new("Lion", Lion::default(), F32),
        Case::new("RMSprop", RmsProp::default(), F32),
        Case::new("RMSprop centered", RmsProp { centered: true, ..RmsProp::default() }, F32),
        Case::new("RMSprop momentum", RmsProp { momentum: 0.9, ..RmsProp::default() }, F32),
        Case::new("AdEMAMix", AdEMAMix::default(), F32),
        Case::new("Schedule-Free AdamW", ScheduleFreeAdamW::default(), F32),
        Case::new("LAMB", Lamb::default(), F32),
        Case::new("Adafactor", Adafactor::default(), F32),
        Case::new("Muon", Muon::default(), F32),
        Case::new("ADOPT", Adopt::default(), F32),
        Case::new("Adan", Adan::default(), F32),
        Case::new("Adam", Adam::default(), Q8),
        Case::new("AdamW", Adam::adamw(), Q8),
        Case::new("SGD momentum", Sgd { momentum: 0.9, ..sgd }, Q8),
        Case::new("Lion", Lion::default(), Q8),
        Case::new("RMSprop", RmsProp::default(), Q8),
        Case::new("AdEMAMix", AdEMAMix::default(), Q8),
        Case::new("Adam", Adam::default(), Q4),
        Case::new("AdamW", Adam::adamw(), Q4),
    ]
}

/// Three tensors: a matrix with 8-bit or 4-bit state where the case keeps it, a smaller
/// matrix, and a vector (a third matrix for Muon, which takes matrices only).
pub fn shapes(case: &Case) -> Vec<Vec<usize>> {
    let last = if case.is_muon() { vec![3, 11] } else { vec![33] };
    vec![vec![8, 12], vec![5, 7], last]
}

pub fn lens(shapes: &[Vec<usize>]) -> Vec<usize> {
    shapes.iter().map(|s| s.iter().product()).collect()
}

/// One context for the file, its uncaptured-error handler recording: every test ends by
/// asserting it saw nothing ([`assert_clean`]).
pub fn ctx() -> GpuContext {
    watched().0.clone()
}

fn watched() -> &'static (GpuContext, Arc<Mutex<Vec<String>>>) {
    static WATCHED: OnceLock<(GpuContext, Arc<Mutex<Vec<String>>>)> = OnceLock::new();
    WATCHED.get_or_init(crate::common::watched_ctx)
}

/// Fails with any error that reached the device's handler.
#[track_caller]
pub fn assert_clean() {
    let ctx = ctx();
    // Let the device report what the work so far raised.
    let _ = ctx.device().poll(wgpu::PollType::wait_indefinitely());
    crate::common::assert_no_uncaptured(&watched().1);
}

/// Deterministic values in [-scale, scale) on a grid of 1/1024, none zero.
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = crate::common::Rng::new(seed);
    (0..n)
        .map(|_| {
            let v = ((rng.uniform() * 1024.0).round() / 1024.0) as f32 * scale;
            if v == 0.0 {
                scale / 1024.0
            } else {
                v
            }
        })
        .collect()
}

/// A named array of one tensor: its values (states dequantized) and its stored bits (any
/// NaN as one NaN), so that two backends compare bit for bit.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub name: String,
    pub values: Vec<f32>,
    pub bits: Vec<u32>,
}

fn f32_array(name: String, values: Vec<f32>) -> Array {
    let bits = values.iter().map(|v| if v.is_nan() { f32::NAN.to_bits() } else { v.to_bits() }).collect();
    Array { name, values, bits }
}

pub fn q8_array(name: String, kind: StateKind, state: &StoredState) -> Array {
    match state {
        StoredState::F32(values) => f32_array(name, values.clone()),
        StoredState::Q8 { codes, absmax } => {
            let values = bnb::dequantize(codes, absmax, &bnb::map_for(kind.torch_name()));
            let bits =
                codes.iter().map(|&c| u32::from(c)).chain(absmax.iter().map(|a| a.to_bits())).collect();
            Array { name, values, bits }
        }
    }
}

pub fn q4_array(name: String, kind: StateKind, state: &Q4State) -> Array {
    match state {
        Q4State::F32(values) => f32_array(name, values.clone()),
        Q4State::Q4 { codes, scale } => {
            let map = if kind == StateKind::ExpAvgSq { ao4::unsigned_map() } else { ao4::signed_map() };
            let values = ao4::dequantize(&ao4::unpack(codes), scale, &map, Q4.block_size);
            let bits = codes.iter().map(|&c| u32::from(c)).chain(scale.iter().map(|s| s.to_bits())).collect();
            Array { name, values, bits }
        }
    }
}

/// What a backend holds: the step count and, per tensor, `[param, states...]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub step: u64,
    pub tensors: Vec<Vec<Array>>,
}

pub fn state_name(kind: StateKind, i: usize) -> String {
    format!("{}[{i}]", kind.torch_name())
}

/// A GPU optimizer over f32 parameters with one gradient tensor per parameter.
pub struct Gpu {
    pub ctx: GpuContext,
    pub case: Case,
    pub shapes: Vec<Vec<usize>>,
    pub opt: Optimizer,
    pub params: Vec<Tensor>,
    pub grads: Vec<Tensor>,
}

impl Gpu {
    /// Parameters in groups of `groups[k]` tensors (each with the case's algorithm), each
    /// parameter and gradient the first elements of a buffer `room` elements longer.
    pub fn build(
        case: &Case,
        shapes: &[Vec<usize>],
        start: &[Vec<f32>],
        groups: &[usize],
        room: u64,
    ) -> Self {
        let ctx = ctx();
        let roomy = |label: &str, values: &[f32]| {
            let t = ctx.zeros(label, values.len() as u64 + room, DType::F32);
            let t = Tensor { len: values.len() as u64, ..t };
            let values: Vec<f64> = values.iter().map(|&x| f64::from(x)).collect();
            ctx.write(&t, &values).unwrap_or_else(|e| panic!("{e}"));
            t
        };
        let params: Vec<Tensor> = start.iter().map(|p| roomy("param", p)).collect();
        let grads = start.iter().map(|p| roomy("grad", &vec![0.0; p.len()])).collect();
        let builder = case.gpu(shapes);
        let built = if groups.len() == 1 {
            builder.build(&ctx, case.algorithm, &params)
        } else {
            let mut first = 0;
            let groups = groups
                .iter()
                .map(|&n| {
                    first += n;
                    ParamGroup::new(case.algorithm, &params[first - n..first])
                })
                .collect();
            builder.build_groups(&ctx, groups)
        };
        let opt = built.unwrap_or_else(|e| panic!("{} {:?} {shapes:?}: {e}", case.name, case.storage));
        Gpu { ctx, case: *case, shapes: shapes.to_vec(), opt, params, grads }
    }

    pub fn step(&mut self, grads: &[Vec<f32>]) {
        for (t, g) in self.grads.iter().zip(grads) {
            let g: Vec<f64> = g.iter().map(|&x| f64::from(x)).collect();
            self.ctx.write(t, &g).unwrap_or_else(|e| panic!("{e}"));
        }
        let case = &self.case;
        self.opt.step(&self.grads).unwrap_or_else(|e| panic!("{} {:?}: {e}", case.name, case.storage));
    }

    pub fn held(&self) -> Held {
        let read = |t: &Tensor| -> Vec<f32> { self.ctx.read_f32(t).unwrap_or_else(|e| panic!("{e}")) };
        let tensors = (0..self.params.len())
            .map(|i| {
                let mut arrays = vec![f32_array(format!("param[{i}]"), read(&self.params[i]))];
                for &kind in self.case.kinds(&self.shapes[i]) {
                    let name = state_name(kind, i);
                    arrays.push(match self.case.storage {
                        Storage::F32 => f32_array(
                            name.clone(),
                            read(self.opt.state(i, kind).unwrap().and_then(|s| s.dense()).unwrap()),
                        ),
                        Storage::Q8 => {
                            let state = self
                                .opt
                                .state(i, kind)
                                .map(|s| s.and_then(|v| v.q8()))
                                .unwrap_or_else(|e| panic!("{name}: {e}"))
                                .unwrap();
                            q8_array(name, kind, &state)
                        }
                        Storage::Q4 => {
                            let state = self
                                .opt
                                .state(i, kind)
                                .map(|s| s.and_then(|v| v.q4()))
                                .unwrap_or_else(|e| panic!("{name}: {e}"))
                                .unwrap();
                            q4_array(name, kind, &state)
                        }
                    });
                }
                arrays
            })
            .collect();
        Held { step: self.opt.step_count(), tensors }
    }
}

/// The CPU backend over f32 parameters it keeps.
pub struct Cpu {
    pub case: Case,
    pub shapes: Vec<Vec<usize>>,
    pub opt: CpuOptimizer,
    pub params: Vec<Vec<f32>>,
}

impl Cpu {
    pub fn new(case: &Case, shapes: &[Vec<usize>], start: &[Vec<f32>]) -> Self {
        let views: Vec<HostSlice<'_>> = start.iter().map(|p| HostSlice::F32(p)).collect();
        let opt = case
            .cpu(shapes)
            .build(case.algorithm, &views)
            .unwrap_or_else(|e| panic!("{} {:?}: {e}", case.name, case.storage));
        Cpu { case: *case, shapes: shapes.to_vec(), opt, params: start.to_vec() }
    }

    pub fn step(&mut self, grads: &[Vec<f32>]) {
        let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::F32(g)).collect();
        let mut params: Vec<HostSliceMut<'_>> =
            self.params.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
        let case = &self.case;
        self.opt
            .step(&mut params, &grads)
            .unwrap_or_else(|e| panic!("{} {:?}: {e}", case.name, case.storage));
    }

    pub fn held(&self) -> Held {
        let tensors = (0..self.params.len())
            .map(|i| {
                let mut arrays = vec![f32_array(format!("param[{i}]"), self.params[i].clone())];
                for &kind in self.case.kinds(&self.shapes[i]) {
                    let name = state_name(kind, i);
                    arrays.push(match self.case.storage {
                        Storage::F32 => match self.opt.state(i, kind).and_then(|s| s.dense()).unwrap() {
                            HostSlice::F32(values) => f32_array(name, values.to_vec()),
                            other => panic!("{name}: f32 state expected, got {:?}", other.dtype()),
                        },
                        Storage::Q8 => {
                            q8_array(name, kind, self.opt.state(i, kind).and_then(|s| s.q8()).unwrap())
                        }
                        Storage::Q4 => {
                            q4_array(name, kind, self.opt.state(i, kind).and_then(|s| s.q4()).unwrap())
                        }
                    });
                }
                arrays
            })
            .collect();
        Held { step: self.opt.step_count(), tensors }
    }
}

/// Where two holdings differ first (bits, any NaN equal to any NaN), in words; `None` where
/// they are the same.
pub fn difference(a: &Held, b: &Held) -> Option<String> {
    if a.step != b.step {
        return Some(format!("step {} against {}", a.step, b.step));
    }
    for (ta, tb) in a.tensors.iter().zip(&b.tensors) {
        for (x, y) in ta.iter().zip(tb) {
            if x.bits.len() != y.bits.len() {
                return Some(format!("{}: {} stored words against {}", x.name, x.bits.len(), y.bits.len()));
            }
            if let Some(j) = (0..x.bits.len()).find(|&j| x.bits[j] != y.bits[j]) {
                let value = |a: &Array| a.values.get(j).map_or("-".into(), |v| format!("{v:e}"));
                return Some(format!(
                    "{} word {j}: {:#x} ({}) against {:#x} ({})",
                    x.name,
                    x.bits[j],
                    value(x),
                    y.bits[j],
                    value(y)
                ));
            }
        }
    }
    None
}

/// Fails with [`difference`] where `a` and `b` differ.
#[track_caller]
pub fn assert_same(a: &Held, b: &Held, what: &str) {
    if let Some(d) = difference(a, b) {
        panic!("{what}: {d}");
    }
}
