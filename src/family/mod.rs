//! One folder per algorithm family: its configuration and defaults, its step contract with
//! the kernels (uniform, switches), its WGSL beside them, and its CPU loops.
//!
//! [`registry`] is the one list of families. A family is added by writing its folder and
//! one line there; every enum and match over families (`Algorithm`, `Family`, `Switches`,
//! `KernelStep`, the CPU update, the public re-export of its configuration) is generated
//! from that line.

/// The registry of families, one line each:
/// `Family => folder: AlgorithmVariant(Config),`
///
/// - `Family`: its variant of `crate::step::Family` (and of `Switches`, `KernelStep`);
/// - `folder`: its folder under `src/family/`, which provides `NAME`, `UPDATE_WGSL`,
///   `CAPTURABLE_WGSL`, `config::Config` (with `impl FamilyConfig`) and `contract`;
/// - `AlgorithmVariant(Config)`: its variant of the public [`crate::Algorithm`] and the
///   public configuration type, re-exported at the crate's root.
///
/// `registry!(then)` calls the macro `then` with the list; `then` is one of the generators
/// (`declare_folders` here, `families!` in `crate::step`, `algorithms!` in `crate::algo`,
/// `export_configs` in the crate's root), each taking what it needs of a line.
macro_rules! registry {
    ($then:ident) => {
        $then! {
            /// Adam, AdamW and AMSGrad in the PyTorch, ONNX and DirectML conventions.
            Adam => adam: Adam(Adam),
            /// SGD with standard or Nesterov momentum, or none (PyTorch SGD, ONNX Momentum).
            Momentum => momentum: Sgd(Sgd),
            /// Adagrad (ONNX and PyTorch).
            Adagrad => adagrad: Adagrad(Adagrad),
            /// Lion (lion-pytorch).
            Lion => lion: Lion(Lion),
            /// Schedule-Free AdamW (the `schedulefree` package).
            ScheduleFree => schedule_free: ScheduleFreeAdamW(ScheduleFreeAdamW),
            /// Adafactor (PyTorch's): not elementwise, it runs passes of its own.
            Adafactor => adafactor: Adafactor(Adafactor),
            /// Muon (`torch.optim.Muon`, 2-D parameters only): the elementwise end runs
            /// decay and the orthogonalized update.
            Muon => muon: Muon(Muon),
            /// RMSprop (PyTorch), plain or centered, with or without momentum.
            RmsProp => rmsprop: RmsProp(RmsProp),
            /// AdEMAMix (bitsandbytes).
            Ademamix => ademamix: AdEMAMix(AdEMAMix),
            /// LAMB (torch-optimizer's `Lamb`): two passes around each tensor's norms.
            Lamb => lamb: Lamb(Lamb),
            /// ADOPT (the official `adopt.ADOPT`).
            Adopt => adopt: Adopt(Adopt),
            /// Adan (the official `adan.Adan`).
            Adan => adan: Adan(Adan),
        }
    };
}
pub(crate) use registry;

/// The family folders, from the registry.
macro_rules! declare_folders {
    ($($(#[$doc:meta])* $family:ident => $folder:ident: $variant:ident($config:ident),)*) => {
        $(pub(crate) mod $folder;)*
    };
}

registry!(declare_folders);

/// Each family's names as the registry spells them, for the tests that check the source tree
/// and the front pages against it.
#[cfg(test)]
pub(crate) struct Listed {
    /// Its variant of `Family` (and of `Switches`, `KernelStep`, `CpuUpdate`).
    pub(crate) family: &'static str,
    /// Its folder under `src/family/`.
    pub(crate) folder: &'static str,
    /// Its variant of `Algorithm`.
    pub(crate) variant: &'static str,
    /// Its configuration type.
    pub(crate) config: &'static str,
}

#[cfg(test)]
macro_rules! listed {
    ($($(#[$doc:meta])* $family:ident => $folder:ident: $variant:ident($config:ident),)*) => {
        /// Every family, from the registry.
        pub(crate) const LISTED: &[Listed] = &[$(Listed {
            family: stringify!($family),
            folder: stringify!($folder),
            variant: stringify!($variant),
            config: stringify!($config),
        },)*];
    };
}

#[cfg(test)]
registry!(listed);

#[cfg(test)]
mod layout_tests;
