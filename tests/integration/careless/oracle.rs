//! The f64 oracle's run of a case, held as the backends' are (values only).

use wgpu_optim::{Algorithm, DType};
use wgpu_optim_testkit::oracle::{
    ao4, ao4_adam_step, bnb_8bit_step, muon_step, AdafactorOracle, LambOracle, ScheduleFreeOracle, State4bit,
    State8bit, ToLibrary, ToOracle, TorchState,
};

use super::cases::{lens, q4_array, q8_array, state_name, Array, Case, Held, Storage, Q4, Q8};

/// The f64 oracle of a case, its states held per tensor in the case's state order.
pub enum Oracle {
    Torch(Vec<TorchState>),
    ScheduleFree(ScheduleFreeOracle),
    Lamb(LambOracle),
    Adafactor(AdafactorOracle),
    Muon(Vec<Vec<f64>>),
    Q8(Vec<Vec<State8bit>>),
    Q4(Vec<[State4bit; 2]>),
}

/// The oracle's run: parameters in f64 (rounded to f32 where the backends store), states.
pub struct OracleRun {
    pub case: Case,
    pub shapes: Vec<Vec<usize>>,
    pub params: Vec<Vec<f64>>,
    pub oracle: Oracle,
    pub step: u64,
}

impl OracleRun {
    pub fn new(case: &Case, shapes: &[Vec<usize>], start: &[Vec<f32>]) -> Self {
        let lens = lens(shapes);
        let params: Vec<Vec<f64>> = start.iter().map(|p| p.iter().map(|&x| f64::from(x)).collect()).collect();
        let oracle = match (case.storage, case.algorithm) {
            (Storage::Q8, algorithm) => Oracle::Q8(
                lens.iter()
                    .map(|&n| {
                        let quantized = Q8.quantizes(n as u64);
                        algorithm.state_kinds().iter().map(|_| State8bit::zeros(n, quantized)).collect()
                    })
                    .collect(),
            ),
            (Storage::Q4, _) => Oracle::Q4(
                lens.iter()
                    .map(|&n| {
                        let zeros = || ao4::zeros(n, Q4.block_size, Q4.min_size as usize);
                        [zeros(), zeros()]
                    })
                    .collect(),
            ),
            (_, Algorithm::ScheduleFreeAdamW(c)) => Oracle::ScheduleFree(
                ScheduleFreeOracle::new(c.to_oracle(), lens.len())
                    .storing(DType::F32.to_oracle(), DType::F32.to_oracle()),
            ),
            (_, Algorithm::Lamb(c)) => Oracle::Lamb(
                LambOracle::new(c.to_oracle(), lens.len())
                    .storing(DType::F32.to_oracle(), DType::F32.to_oracle()),
            ),
            (_, Algorithm::Adafactor(c)) => Oracle::Adafactor(AdafactorOracle::new(
                c.to_oracle(),
                shapes.to_vec(),
                DType::F32.to_oracle(),
            )),
            (_, Algorithm::Muon(_)) => Oracle::Muon(lens.iter().map(|&n| vec![0.0; n]).collect()),
            (_, algorithm) => Oracle::Torch(
                lens.iter()
                    .map(|&n| {
                        TorchState::new(algorithm.to_oracle(), n)
                            .storing(DType::F32.to_oracle(), DType::F32.to_oracle())
                    })
                    .collect(),
            ),
        };
        OracleRun { case: *case, shapes: shapes.to_vec(), params, oracle, step: 0 }
    }

    pub fn step(&mut self, grads: &[Vec<f32>]) {
        self.step += 1;
        let grads: Vec<Vec<f64>> = grads.iter().map(|g| g.iter().map(|&x| f64::from(x)).collect()).collect();
        let algorithm = self.case.algorithm;
        let params = &mut self.params;
        match &mut self.oracle {
            Oracle::Torch(states) => {
                for ((p, g), s) in params.iter_mut().zip(&grads).zip(states) {
                    s.step(p, g);
                }
            }
            Oracle::ScheduleFree(o) => o.step(params, &grads),
            Oracle::Lamb(o) => o.step(params, &grads),
            Oracle::Adafactor(o) => o.step(params, &grads),
            Oracle::Muon(buffers) => {
                let Algorithm::Muon(config) = algorithm else { unreachable!() };
                for (((p, g), b), shape) in params.iter_mut().zip(&grads).zip(buffers).zip(&self.shapes) {
                    muon_step(&config.to_oracle(), p, g, b, shape[0], shape[1]);
                    p.iter_mut().for_each(|x| *x = f64::from(*x as f32));
                    b.iter_mut().for_each(|x| *x = f64::from(*x as f32));
                }
            }
            Oracle::Q8(states) => {
                for ((p, g), s) in params.iter_mut().zip(&grads).zip(states) {
                    bnb_8bit_step(&algorithm.to_oracle(), self.step, p, g, s)
                        .unwrap_or_else(|e| panic!("{e}"));
                }
            }
            Oracle::Q4(states) => {
                let Algorithm::Adam(config) = algorithm else { unreachable!() };
                for ((p, g), [m, v]) in params.iter_mut().zip(&grads).zip(states) {
                    ao4_adam_step(&config.to_oracle(), self.step, Q4.block_size, p, g, m, v)
                        .unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }

    /// Values only (the oracle stores no bits of its own): `bits` is left empty.
    pub fn held(&self) -> Held {
        let f64s = |name: String, v: &[f64]| Array {
            name,
            values: v.iter().map(|&x| x as f32).collect(),
            bits: Vec::new(),
        };
        let tensors = (0..self.params.len())
            .map(|i| {
                let kinds = self.case.kinds(&self.shapes[i]);
                let mut arrays = vec![f64s(format!("param[{i}]"), &self.params[i])];
                let names = kinds.iter().map(|&k| state_name(k, i));
                match &self.oracle {
                    Oracle::Torch(states) => {
                        arrays.extend(names.zip(states[i].tensors()).map(|(n, v)| f64s(n, &v)));
                    }
                    Oracle::ScheduleFree(o) => {
                        let z = if o.z[i].is_empty() { self.params[i].clone() } else { o.z[i].clone() };
                        let v = if o.exp_avg_sq[i].is_empty() {
                            vec![0.0; z.len()]
                        } else {
                            o.exp_avg_sq[i].clone()
                        };
                        arrays.extend(names.zip([z, v]).map(|(n, v)| f64s(n, &v)));
                    }
                    Oracle::Lamb(o) => {
                        arrays.extend(names.zip([&o.exp_avg[i], &o.exp_avg_sq[i]]).map(|(n, v)| f64s(n, v)));
                    }
                    Oracle::Adafactor(o) => {
                        let s = &o.state[i];
                        let states =
                            if kinds.len() == 2 { vec![&s.row_var, &s.col_var] } else { vec![&s.variance] };
                        arrays.extend(names.zip(states).map(|(n, v)| f64s(n, v)));
                    }
                    Oracle::Muon(buffers) => arrays.extend(names.map(|n| f64s(n, &buffers[i]))),
                    Oracle::Q8(states) => {
                        arrays.extend(
                            names
                                .zip(kinds)
                                .zip(&states[i])
                                .map(|((n, &k), s)| q8_array(n, k, &s.to_library())),
                        );
                    }
                    Oracle::Q4(states) => {
                        arrays.extend(
                            names
                                .zip(kinds)
                                .zip(&states[i])
                                .map(|((n, &k), s)| q4_array(n, k, &s.to_library())),
                        );
                    }
                }
                arrays
            })
            .collect();
        Held { step: self.step, tensors }
    }
}
