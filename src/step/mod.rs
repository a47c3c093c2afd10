//! The typed contract between an algorithm's configuration and the kernels that run it,
//! shared by the GPU and the CPU backend (this module knows neither wgpu nor rayon).
//!
//! A step of a family is its switches (compile-time: WGSL override constants on the GPU,
//! const generics on the CPU) and its uniform (per-step values: one `#[repr(C)]` Pod struct
//! whose bytes the GPU uploads and whose fields the CPU loops read). The WGSL declarations
//! of both are generated from the Rust definitions, so a field cannot move on one side only.
//!
//! Each family's own contract lives in its folder (`crate::family::<name>::contract`); this
//! module generates the enums over them from the family registry. Path of a hyperparameter:
//! `Adam::kernel_step` fills `AdamUniform64` in f64 → [`KernelStep::write_uniform`] (GPU) or
//! `AdamUniform64::to_f32` (CPU) → `hp.<field>` in `src/family/adam/adam.wgsl` and
//! `src/family/adam/cpu.rs`.

pub(crate) mod clip;
pub(crate) mod device;
pub(crate) mod fields;
pub(crate) mod rounding;

pub(crate) use fields::Override;

use crate::{DType, StateKind};

/// Bytes reserved for one uniform: room for the largest in f64, and a multiple of every
/// adapter's `min_uniform_buffer_offset_alignment` (WebGPU caps it at 256).
pub(crate) const UNIFORM_SLOT_BYTES: u64 = 256;

/// From the family registry (`crate::family::registry`, one line per family:
/// `Variant => folder: ..`, the folder under `crate::family`), the enums [`Family`],
/// [`Switches`] and [`KernelStep`] and every match over them. A family's folder provides
/// what the generated code reads: `NAME`, `UPDATE_WGSL` and `CAPTURABLE_WGSL` (`""` where it
/// has none), and in its `contract` the aliases `Switches`, `Uniform` and `Uniform64`
/// (the `uniform!` pair) and the slots `INPUTS` and `OUTPUTS`.
macro_rules! families {
    ($($(#[$doc:meta])* $variant:ident => $folder:ident: $algorithm:ident($config:ident),)*) => {
        /// The algorithm families that have a fused update.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub(crate) enum Family {
            $($(#[$doc])* $variant,)*
        }

        impl Family {
            /// The family's name in labels and pipeline keys.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(Family::$variant => crate::family::$folder::NAME,)*
                }
            }

            /// The slots the update reads, in the order its arguments are given.
            pub(crate) fn inputs(self) -> &'static [Slot] {
                match self {
                    $(Family::$variant => crate::family::$folder::contract::INPUTS,)*
                }
            }

            /// The slots the update writes, in the order its arguments are given.
            pub(crate) fn outputs(self) -> &'static [Slot] {
                match self {
                    $(Family::$variant => crate::family::$folder::contract::OUTPUTS,)*
                }
            }

            /// The WGSL body of the elementwise update (`update`), `""` for none.
            pub(crate) fn update_wgsl(self) -> &'static str {
                match self {
                    $(Family::$variant => crate::family::$folder::UPDATE_WGSL,)*
                }
            }

            /// The WGSL that derives the step's uniform fields on the device (capturable
            /// mode's `at_step`), `""` where capturable mode is refused.
            pub(crate) fn capturable_wgsl(self) -> &'static str {
                match self {
                    $(Family::$variant => crate::family::$folder::CAPTURABLE_WGSL,)*
                }
            }
        }

        /// The compile-time switches of one family: what selects a compiled variant.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub(crate) enum Switches {
            $($variant(crate::family::$folder::contract::Switches),)*
        }

        impl Switches {
            pub(crate) fn family(&self) -> Family {
                match self {
                    $(Switches::$variant(_) => Family::$variant,)*
                }
            }

            /// The shader's override constants, each declared and set from this one list.
            pub(crate) fn overrides(&self) -> Vec<Override> {
                match self {
                    $(Switches::$variant(s) => s.overrides(),)*
                }
            }

            /// Bytes of the family's uniform in a kernel whose math runs in `math`.
            pub(crate) fn uniform_bytes(&self, math: DType) -> u64 {
                use std::mem::size_of;
                let wide = math == DType::F64;
                (match self {
                    $(Switches::$variant(_) if wide => size_of::<crate::family::$folder::contract::Uniform64>(),
                      Switches::$variant(_) => size_of::<crate::family::$folder::contract::Uniform>(),)*
                }) as u64
            }

            /// The WGSL declaration of the family's uniform, `struct Hyper`.
            pub(crate) fn uniform_wgsl(&self) -> String {
                match self {
                    $(Switches::$variant(_) => crate::family::$folder::contract::Uniform::wgsl("Hyper"),)*
                }
            }
        }

        /// One step of one family: its switches and its uniform, computed on the host in f64.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub(crate) enum KernelStep {
            $($variant(crate::family::$folder::contract::Switches, crate::family::$folder::contract::Uniform64),)*
        }

        // Every uniform fits its slot, in f64, before the rounding header that follows it.
        $(const _: () = assert!(
            std::mem::size_of::<crate::family::$folder::contract::Uniform64>() as u64
                <= rounding::RoundingHeader::OFFSET
        );)*

        impl KernelStep {
            pub(crate) fn family(&self) -> Family {
                self.switches().family()
            }

            pub(crate) fn switches(&self) -> Switches {
                match self {
                    $(KernelStep::$variant(s, _) => Switches::$variant(*s),)*
                }
            }

            /// Writes the uniform's bytes for a kernel whose math runs in `math` (f64 for
            /// double tensors, f32 otherwise) into `out`, zero-padding the rest of it.
            pub(crate) fn write_uniform(&self, math: DType, out: &mut [u8]) {
                fn copy(out: &mut [u8], bytes: &[u8]) {
                    out.fill(0);
                    out[..bytes.len()].copy_from_slice(bytes);
                }
                let wide = math == DType::F64;
                match self {
                    $(KernelStep::$variant(_, u) if wide => copy(out, bytemuck::bytes_of(u)),
                      KernelStep::$variant(_, u) => copy(out, bytemuck::bytes_of(&u.to_f32())),)*
                }
            }
        }

        // bitsandbytes' 8-bit kernels' rules that go by the switches (`crate::q8::Q8Switches`,
        // which each family's switches implement in its folder).
        impl Switches {
            /// The switches of bitsandbytes' 32-bit kernel, for a tensor below `min_8bit_size`.
            pub(crate) fn q8_f32_state(self) -> Switches {
                match self {
                    $(Switches::$variant(s) => Switches::$variant(crate::q8::Q8Switches::f32_state(s)),)*
                }
            }

            /// Whether a non-finite gradient leaves its parameter and restarts its 8-bit states.
            pub(crate) fn q8_restarts_non_finite(&self) -> bool {
                match self {
                    $(Switches::$variant(_) => <crate::family::$folder::contract::Switches as crate::q8::Q8Switches>::RESTARTS_NON_FINITE,)*
                }
            }
        }

        impl KernelStep {
            /// This step as bitsandbytes' 32-bit kernel runs it, for a tensor below
            /// `min_8bit_size`.
            #[cfg_attr(not(feature = "cpu"), allow(dead_code))]
            pub(crate) fn q8_f32_state(self) -> KernelStep {
                match self {
                    $(KernelStep::$variant(s, u) => KernelStep::$variant(crate::q8::Q8Switches::f32_state(s), u),)*
                }
            }
        }

        // The CPU backend: each family's folder gives, in its `cpu`,
        // `loops(&Switches, &Uniform64)`, its loops for a step.
        /// One step's CPU update of any family, held by value (a step allocates nothing).
        #[cfg(feature = "cpu")]
        pub(crate) enum CpuUpdate {
            $($variant(crate::cpu::kernels::Bound<crate::family::$folder::cpu::Hyper>),)*
        }

        #[cfg(feature = "cpu")]
        impl CpuUpdate {
            /// The update, its family erased for the kernel that runs it.
            pub(crate) fn as_update(&self) -> &dyn crate::cpu::kernels::Update {
                match self {
                    $(CpuUpdate::$variant(update) => update,)*
                }
            }
        }

        #[cfg(feature = "cpu")]
        impl KernelStep {
            /// The CPU backend's update for this step: the family's loops for its switches,
            /// for every storage type, with its uniform in f32.
            pub(crate) fn cpu_update(&self) -> CpuUpdate {
                match self {
                    $(KernelStep::$variant(switches, uniform) => {
                        CpuUpdate::$variant(crate::family::$folder::cpu::loops(switches, uniform))
                    })*
                }
            }
        }

        // What the tests read from each family's contract: its switch combinations, its
        // widest switches and its uniform's Rust layout.
        #[cfg(test)]
        impl Switches {
            /// Every switch combination of every family (each folder's
            /// `contract::every_switches`).
            pub(crate) fn every() -> Vec<Switches> {
                let mut all = Vec::new();
                $(all.extend(
                    crate::family::$folder::contract::every_switches().into_iter().map(Switches::$variant),
                );)*
                all
            }

            /// Each family's switches that bind the most state (`contract::WIDEST_SWITCHES`),
            /// where it has them.
            pub(crate) fn widest() -> Vec<Switches> {
                [$(crate::family::$folder::contract::WIDEST_SWITCHES.map(Switches::$variant),)*]
                    .into_iter()
                    .flatten()
                    .collect()
            }

            /// The names and byte offsets of the fields of the family's uniform in a kernel
            /// whose math runs in `math`: the Rust layout WGSL's `struct Hyper` must match.
            pub(crate) fn uniform_layout(&self, math: DType) -> (&'static [&'static str], &'static [usize]) {
                let wide = math == DType::F64;
                match self {
                    $(Switches::$variant(_) if wide => (
                        crate::family::$folder::contract::Uniform::FIELDS,
                        crate::family::$folder::contract::Uniform64::OFFSETS,
                    ),
                    Switches::$variant(_) => (
                        crate::family::$folder::contract::Uniform::FIELDS,
                        crate::family::$folder::contract::Uniform::OFFSETS,
                    ),)*
                }
            }
        }

        // The bound of the fixed-size state arrays the CPU loops and the blockwise engines
        // keep, from the families' slots, so that no shared file names a state count.
        /// The most state tensors any family's update keeps (its `INPUTS`' states, Kahan's
        /// compensation aside: the optimizer keeps that one).
        #[cfg_attr(not(feature = "cpu"), allow(dead_code))]
        pub(crate) const MAX_STATE: usize = {
            let counts = [$(state_count(crate::family::$folder::contract::INPUTS),)*];
            let (mut most, mut i) = (0, 0);
            while i < counts.len() {
                if counts[i] > most {
                    most = counts[i];
                }
                i += 1;
            }
            most
        };
    };
}

crate::family::registry!(families);

/// A tensor role in a kernel: what `load_<slot>`/`store_<slot>` read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    /// The parameters (in master-weight mode, the f32 masters).
    Param,
    /// The gradients.
    Grad,
    /// A per-parameter state tensor.
    State(StateKind),
    /// Master-weight mode: the model's low-precision copy of the new parameters.
    ParamCopy,
}

/// The state tensors among `slots` that a family's update keeps: every [`Slot::State`] but
/// Kahan's compensation, which the optimizer keeps.
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
const fn state_count(slots: &[Slot]) -> usize {
    let (mut count, mut i) = (0, 0);
    while i < slots.len() {
        if let Slot::State(kind) = slots[i] {
            if !matches!(kind, StateKind::KahanCompensation) {
                count += 1;
            }
        }
        i += 1;
    }
    count
}

impl Slot {
    /// The name in the generated WGSL (`load_exp_avg`): PyTorch's state names.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Slot::Param => "param",
            Slot::Grad => "grad",
            Slot::State(kind) => kind.torch_name(),
            Slot::ParamCopy => "param_copy",
        }
    }
}
