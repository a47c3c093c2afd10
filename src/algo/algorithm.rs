//! The algorithms the stateful optimizer runs, and the state tensors each keeps.

use super::FamilyLowBit;
#[cfg(feature = "checkpoint")]
use crate::checkpoint::{FamilyCheckpoint, JsonFields};
use crate::step::{Family, KernelStep};
use crate::Result;

/// What [`Algorithm`] reads of a family's configuration, implemented in the family's folder
/// (`crate::family::<name>::config`), so that no method of `Algorithm` matches on families
/// by hand: the registry's line of each generates its arm.
pub(crate) trait FamilyConfig: Copy {
    /// The family of kernels that runs it.
    const FAMILY: Family;
    /// The class name PyTorch would use.
    fn torch_class(&self) -> &'static str;
    /// Checks the hyperparameters.
    fn validate(&self) -> Result<()>;
    /// The kernel step for step `t` (counted from 1).
    fn kernel_step(&self, t: u64) -> KernelStep;
    /// The learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate.
    fn set_lr(&mut self, lr: f64);
    /// The state tensors it keeps per parameter, in PyTorch's order.
    fn state_kinds(&self) -> &'static [StateKind];
    /// The value a state tensor starts from.
    fn initial_state(&self) -> f64 {
        0.0
    }
    /// The family's own global gradient clipping, `(max_norm, eps)`: every gradient of the
    /// optimizer multiplied by `min(1, max_norm / (L2 norm + eps))` before the step, through
    /// the same fused passes as `grad_clip`. `None` (every family but Adan): none.
    fn own_grad_clip(&self) -> Option<(f64, f64)> {
        None
    }
    /// Why a stateless update ([`crate::ops::update`]) cannot run it (a step that needs what
    /// only an optimizer keeps); `None` (most families): it can.
    fn stateless_refusal(&self) -> Option<&'static str> {
        None
    }
    /// The passes a CPU optimizer of this family runs beside the elementwise kernel, with
    /// their state, over parameters of `lens` built with `options`; refuses the options they
    /// do not run. `None` (the elementwise families): the kernel alone.
    /// The constructor of its family's passes on the GPU over an optimizer's groups
    /// (`None`, the elementwise families: the kernel alone).
    const GPU_PASSES: Option<crate::optimizer::passes::Build> = None;
    /// How its family records a stateless update ([`crate::ops::update`]) whose step is
    /// more than the elementwise kernel (passes around each tensor's norms); `None` (the
    /// elementwise families): the kernel alone.
    const STATELESS_PASSES: Option<crate::ops::RecordStateless> = None;

    #[cfg(feature = "cpu")]
    fn cpu_passes(
        &self,
        options: &crate::OptimizerOptions,
        lens: &[usize],
    ) -> Result<Option<Box<dyn crate::cpu::passes::CpuPasses>>> {
        let _ = (options, lens);
        Ok(None)
    }

    // The front ends' hooks: what the GPU optimizer's builder and Burn's front ends ask of
    // a family, so that neither names one. Their dispatch is the last block of
    // `algorithms!`.

    /// Refuses the optimizer options the family cannot run under on either backend
    /// (Schedule-Free and Muon refuse capturable mode; LAMB clipping and stochastic rounding
    /// too; Adafactor what its passes do not implement). Both builders check it per group;
    /// a change of a group's algorithm checks the new one against the options the optimizer
    /// keeps ([`OptimizerOptions::kept`](crate::OptimizerOptions::kept)).
    fn check_options(&self, options: &crate::OptimizerOptions) -> Result<()> {
        let _ = options;
        Ok(())
    }

    /// Refuses a group of the GPU optimizer that the family's passes cannot run (its
    /// parameters' dtypes or shapes), after every group's options passed
    /// [`Self::check_options`]; `first` is the index of the group's first parameter across
    /// the groups (the index of `options.param_shapes` and of refusals naming a parameter).
    fn check_gpu_group(
        &self,
        group: &crate::ParamGroup,
        first: usize,
        options: &crate::OptimizerOptions,
    ) -> Result<()> {
        let _ = (group, first, options);
        Ok(())
    }

    /// Why a group cannot change to or from this family in an optimizer already built
    /// (Adafactor's and Muon's per-group states and passes are made for the groups the
    /// optimizer was built with); `None` (every other family): a change is refused only
    /// where the state tensors differ. A family that shares its states with another and
    /// whose passes the optimizer adds on a change (LAMB and Adam) returns `None`.
    fn change_refusal(&self) -> Option<&'static str> {
        None
    }

    /// The step after a group's running values `values` and the values after it, where the
    /// family's steps come from such values rather than the step count (Schedule-Free's `k`,
    /// `weight_sum`, `lr_max`); `None` (every other family): [`Self::kernel_step`] gives it.
    fn step_after(
        &self,
        values: &crate::ScheduleFreeScalars,
    ) -> Option<(KernelStep, crate::ScheduleFreeScalars)> {
        let _ = values;
        None
    }

    /// The step of the family's `eval()` (`to` [`ScheduleFreeMode::Eval`](crate::ScheduleFreeMode))
    /// or `train()` swap of the parameters between the points it keeps (Schedule-Free's y
    /// and x), or why it cannot run; `None` (every other family): the family has no modes.
    fn mode_swap(&self, to: crate::ScheduleFreeMode) -> Option<Result<KernelStep>> {
        let _ = to;
        None
    }

    /// The state kinds a parameter of `shape` keeps, where they depend on the shape
    /// (Adafactor's factored or unfactored second moment); [`Self::state_kinds`] otherwise.
    fn param_state_kinds(&self, shape: &[usize]) -> &'static [StateKind] {
        let _ = shape;
        self.state_kinds()
    }

    /// Whether a step looks at each parameter whole, by its shape (Muon's matrices,
    /// Adafactor's row and column means), so that it needs an optimizer given the shapes,
    /// not the per-tensor elementwise update.
    fn needs_shapes(&self) -> bool {
        false
    }

    /// Whether the family steps matrices only (Muon), leaving the other parameters to a
    /// fallback algorithm.
    fn needs_matrix(&self) -> bool {
        false
    }

    /// Whether a sharded optimizer ([`crate::shard`]) steps each of its tensors whole on one
    /// owner rank, as its step looks at whole tensors that a shard of the flat layout would
    /// cut (Muon's Newton-Schulz); `false` (the elementwise families; LAMB, whose sums
    /// [`Self::shard_sums`] combines; Adafactor, whose pieces its own sharded step takes,
    /// `family::adafactor::shard`): a shard's pieces step alone.
    fn shard_whole(&self) -> bool {
        false
    }

    /// Whether its step takes sums over each whole tensor (LAMB's norms), which a sharded
    /// optimizer combines across the ranks' pieces of the tensor (`CpuStep::sums` and the
    /// GPU passes' split); `false` for the others.
    fn shard_sums(&self) -> bool {
        false
    }

    /// Whether a sharded optimizer's pieces of its tensors take a step of the family's own
    /// on the host, which adds its whole-tensor sums across the ranks (Adafactor's rows and
    /// columns: `family::adafactor::shard`), rather than an inner optimizer's; `false` for
    /// the others.
    fn shard_own_step(&self) -> bool {
        false
    }
}

/// From the family registry (`crate::family::registry`, one line per family:
/// `.. : Variant(Config)`), the enum [`Algorithm`], its `From` conversions and every method that dispatches to the configuration ([`FamilyConfig`]).
macro_rules! algorithms {
    ($($(#[$doc:meta])* $family:ident => $folder:ident: $variant:ident($config:ident),)*) => {
        $(use crate::family::$folder::config::$config;)*

        /// The algorithms the stateful optimizer runs, in PyTorch's conventions.
        ///
        /// `#[non_exhaustive]`: new algorithms add variants, so a `match` needs a `_` arm.
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[non_exhaustive]
        pub enum Algorithm {
            $($(#[$doc])* $variant($config),)*
        }

        $(impl From<$config> for Algorithm {
            fn from(config: $config) -> Self {
                Algorithm::$variant(config)
            }
        })*

        /// The oracle's copy, for the unit tests: each family's configuration converts
        /// itself (its folder's `config.rs`), and this picks the family.
        #[cfg(test)]
        impl crate::oracle::ToOracle for Algorithm {
            type Oracle = wgpu_optim_oracle::Algorithm;

            fn to_oracle(&self) -> Self::Oracle {
                match self {
                    $(Algorithm::$variant(c) => crate::oracle::ToOracle::to_oracle(c).into(),)*
                }
            }
        }

        impl Algorithm {
            /// Checks the hyperparameters. Building an optimizer and changing a group's
            /// algorithm check them anyway; a trainer calls this to check a configuration
            /// (one read from a file, say) before any device exists.
            pub fn validate(&self) -> Result<()> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::validate(c),)*
                }
            }

            pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::kernel_step(c, t),)*
                }
            }

            /// The family of kernels that runs it.
            pub(crate) fn family(&self) -> Family {
                match self {
                    $(Algorithm::$variant(_) => <$config as FamilyConfig>::FAMILY,)*
                }
            }

            /// The learning rate.
            pub fn lr(&self) -> f64 {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::lr(c),)*
                }
            }

            /// The same algorithm with learning rate `lr`.
            pub fn with_lr(mut self, lr: f64) -> Self {
                match &mut self {
                    $(Algorithm::$variant(c) => FamilyConfig::set_lr(c, lr),)*
                }
                self
            }

            /// The state tensors this algorithm keeps per parameter, in PyTorch's order.
            pub fn state_kinds(&self) -> &'static [StateKind] {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::state_kinds(c),)*
                }
            }

            /// The algorithm's own global gradient clipping, `(max_norm, eps)`: Adan's
            /// `max_grad_norm` with its `eps`; `None` for the others (which clip with
            /// [`OptimizerBuilder::grad_clip`](crate::OptimizerBuilder::grad_clip)).
            pub fn own_grad_clip(&self) -> Option<(f64, f64)> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::own_grad_clip(c),)*
                }
            }

            /// The value every element of a new state tensor starts from (0 for most;
            /// Adagrad's `initial_accumulator_value`).
            pub fn initial_state(&self) -> f64 {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::initial_state(c),)*
                }
            }

            /// The class name PyTorch would use.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::torch_class(c),)*
                }
            }

            /// Why a stateless update cannot run it (`FamilyConfig::stateless_refusal`).
            pub(crate) fn stateless_refusal(&self) -> Option<&'static str> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::stateless_refusal(c),)*
                }
            }

            /// Why 8-bit state cannot run it (`FamilyLowBit::q8_refusal`).
            pub(crate) fn q8_refusal(&self, clipped: bool) -> Option<&'static str> {
                match self {
                    $(Algorithm::$variant(c) => FamilyLowBit::q8_refusal(c, clipped),)*
                }
            }

            /// The step at `t` as bitsandbytes' 8-bit kernels run it
            /// (`FamilyLowBit::q8_kernel_step`).
            pub(crate) fn q8_kernel_step(&self, t: u64) -> KernelStep {
                match self {
                    $(Algorithm::$variant(c) => FamilyLowBit::q8_kernel_step(c, t),)*
                }
            }

            /// Why 4-bit state cannot run it (`FamilyLowBit::q4_refusal`).
            pub(crate) fn q4_refusal(&self) -> Option<&'static str> {
                match self {
                    $(Algorithm::$variant(c) => FamilyLowBit::q4_refusal(c),)*
                }
            }

            /// The step at `t` as torchao's 4-bit optimizers run it
            /// (`FamilyLowBit::q4_kernel_step`).
            pub(crate) fn q4_kernel_step(&self, t: u64) -> KernelStep {
                match self {
                    $(Algorithm::$variant(c) => FamilyLowBit::q4_kernel_step(c, t),)*
                }
            }
        }

        impl Algorithm {
            /// The constructors of the families' GPU passes (`FamilyConfig::GPU_PASSES`), in
            /// the registry's order, which is the order a step binds and records them.
            pub(crate) fn gpu_passes() -> impl Iterator<Item = crate::optimizer::passes::Build> {
                [$(<$config as FamilyConfig>::GPU_PASSES,)*].into_iter().flatten()
            }

            /// The constructor of this algorithm's family's GPU passes, if it has them.
            pub(crate) fn gpu_passes_of(&self) -> Option<crate::optimizer::passes::Build> {
                match self {
                    $(Algorithm::$variant(_) => <$config as FamilyConfig>::GPU_PASSES,)*
                }
            }
        }

        #[cfg(feature = "cpu")]
        impl Algorithm {
            /// The CPU passes of its family, if any (`FamilyConfig::cpu_passes`).
            pub(crate) fn cpu_passes(
                &self,
                options: &crate::OptimizerOptions,
                lens: &[usize],
            ) -> Result<Option<Box<dyn crate::cpu::passes::CpuPasses>>> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::cpu_passes(c, options, lens),)*
                }
            }
        }

        #[cfg(feature = "checkpoint")]
        impl Algorithm {
            /// The `param_groups` entry its family writes (`FamilyCheckpoint::to_json`).
            pub(crate) fn family_json(&self) -> serde_json::Value {
                match self {
                    $(Algorithm::$variant(c) => FamilyCheckpoint::to_json(c),)*
                }
            }

            /// The algorithm of the family whose class `class` is, read from `fields`;
            /// `None`: no family's.
            pub(crate) fn from_class_json(class: &str, fields: &JsonFields<'_>) -> Option<Result<Self>> {
                $(if <$config as FamilyCheckpoint>::CLASSES.contains(&class) {
                    return Some(<$config as FamilyCheckpoint>::from_json(class, fields).map(Algorithm::$variant));
                })*
                None
            }

            /// bitsandbytes' file name of a state of `kind` and its half of a stacked tensor,
            /// where the family keeps such names (`FamilyCheckpoint::bnb_state_name`).
            pub(crate) fn bnb_state_name(&self, kind: StateKind) -> Option<(&'static str, Option<usize>)> {
                match self {
                    $(Algorithm::$variant(c) => FamilyCheckpoint::bnb_state_name(c, kind),)*
                }
            }

            /// The shape in files of a state of `kind` of a parameter of `shape`, and its
            /// note, where the family keeps it in a shape of its own
            /// (`FamilyCheckpoint::state_shape`).
            pub(crate) fn checkpoint_state_shape(
                &self,
                kind: StateKind,
                shape: &[usize],
            ) -> Option<(Vec<usize>, &'static str)> {
                match self {
                    $(Algorithm::$variant(c) => FamilyCheckpoint::state_shape(c, kind, shape),)*
                }
            }

            /// Checks the entries its family's passes add to group `g`'s `param_groups`
            /// entry, and gives the mode it was saved in (`FamilyCheckpoint::check_saved_group`).
            pub(crate) fn check_saved_group(
                &self,
                g: usize,
                entry: &crate::checkpoint::JsonMap,
                earlier: Option<crate::ScheduleFreeMode>,
            ) -> Result<Option<crate::ScheduleFreeMode>> {
                match self {
                    $(Algorithm::$variant(c) => FamilyCheckpoint::check_saved_group(c, g, entry, earlier),)*
                }
            }
        }

        // The front ends' hooks (`FamilyConfig::check_options` and after).
        impl Algorithm {
            /// Refuses the options its family cannot run under (`FamilyConfig::check_options`).
            pub(crate) fn check_options(&self, options: &crate::OptimizerOptions) -> Result<()> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::check_options(c, options),)*
                }
            }

            /// Refuses a GPU group its family's passes cannot run
            /// (`FamilyConfig::check_gpu_group`).
            pub(crate) fn check_gpu_group(
                &self,
                group: &crate::ParamGroup,
                first: usize,
                options: &crate::OptimizerOptions,
            ) -> Result<()> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::check_gpu_group(c, group, first, options),)*
                }
            }

            /// Why a group cannot change to or from its family (`FamilyConfig::change_refusal`).
            fn change_refusal(&self) -> Option<&'static str> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::change_refusal(c),)*
                }
            }
        }

        impl Algorithm {
            /// The step after a group's running values and the values after it, where its
            /// steps come from them (`FamilyConfig::step_after`).
            pub(crate) fn step_after(
                &self,
                values: &crate::ScheduleFreeScalars,
            ) -> Option<(KernelStep, crate::ScheduleFreeScalars)> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::step_after(c, values),)*
                }
            }

            /// Whether its steps come from running group values (Schedule-Free's
            /// [`ScheduleFreeScalars`](crate::ScheduleFreeScalars)) rather than the step count:
            /// [`ops::StepScalars::after`](crate::ops::StepScalars::after) gives such a step.
            pub fn keeps_group_values(&self) -> bool {
                self.step_after(&crate::ScheduleFreeScalars::default()).is_some()
            }

            /// The step of its `eval()` or `train()` swap, or why it cannot run; `None`: it
            /// has no modes (`FamilyConfig::mode_swap`).
            pub(crate) fn mode_swap(&self, to: crate::ScheduleFreeMode) -> Option<Result<KernelStep>> {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::mode_swap(c, to),)*
                }
            }

            /// The state kinds a parameter of `shape` keeps: [`Self::state_kinds`], but for
            /// Adafactor, whose second moment is factored (row and column) for a matrix.
            pub fn param_state_kinds(&self, shape: &[usize]) -> &'static [StateKind] {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::param_state_kinds(c, shape),)*
                }
            }

            /// Whether a step looks at each parameter whole, by its shape (Muon's matrices,
            /// Adafactor's row and column means): such an algorithm runs in an
            /// [`Optimizer`](crate::Optimizer) built with
            /// [`param_shapes`](crate::OptimizerBuilder::param_shapes), not in
            /// [`ops::update`](crate::ops::update).
            pub fn needs_shapes(&self) -> bool {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::needs_shapes(c),)*
                }
            }

            /// Whether it steps 2-D parameters only (Muon), leaving the others to another
            /// algorithm.
            pub fn needs_matrix(&self) -> bool {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::needs_matrix(c),)*
                }
            }

            /// Whether a sharded optimizer steps each of its tensors whole on one owner rank.
            #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
            pub(crate) fn shard_whole(&self) -> bool {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::shard_whole(c),)*
                }
            }

            /// Whether its step takes sums over each whole tensor, which a sharded
            /// optimizer combines across ranks.
            #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
            pub(crate) fn shard_sums(&self) -> bool {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::shard_sums(c),)*
                }
            }

            /// Whether a sharded optimizer steps its pieces with the family's own step.
            #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
            pub(crate) fn shard_own_step(&self) -> bool {
                match self {
                    $(Algorithm::$variant(c) => FamilyConfig::shard_own_step(c),)*
                }
            }
        }

        // What a kernel step's family records for a stateless update, read from the
        // configurations of the family's algorithms (`FamilyConfig::FAMILY`), so that the
        // stateless front ends, which hold only a step, name no family.
        impl Family {
            /// The recording of this family's stateless update where it is not the
            /// elementwise kernel alone (`FamilyConfig::STATELESS_PASSES`).
            pub(crate) fn stateless_passes(self) -> Option<crate::ops::RecordStateless> {
                [$((<$config as FamilyConfig>::FAMILY, <$config as FamilyConfig>::STATELESS_PASSES),)*]
                    .into_iter()
                    .find_map(|(family, passes)| if family == self { passes } else { None })
            }
        }
    };
}

crate::family::registry!(algorithms);

impl Algorithm {
    /// Refuses changing a group from this algorithm to `to` in an optimizer already built,
    /// by `set_group_algorithm` or a checkpoint's load, on both backends, where either
    /// family refuses such a change ([`FamilyConfig::change_refusal`]; the group's own
    /// family's reason first).
    pub(crate) fn check_change(&self, to: &Algorithm) -> Result<()> {
        if self.family() == to.family() {
            return Ok(());
        }
        match self.change_refusal().or_else(|| to.change_refusal()) {
            Some(reason) => Err(crate::Error::ConflictingOptions {
                first: "algorithm",
                second: "set_group_algorithm",
                reason,
            }),
            None => Ok(()),
        }
    }
}

/// From one line per state kind (`Variant => "torch_name"`), the enum [`StateKind`], its
/// names and the list of every kind ([`StateKind::ALL`]), so that a new kind is named once.
macro_rules! state_kinds {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// A per-parameter state tensor, named as in PyTorch's `state_dict`.
        ///
        /// `#[non_exhaustive]`: new algorithms bring new state kinds.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum StateKind {
            $($(#[$doc])* $variant,)*
        }

        impl StateKind {
            /// Every state kind, in declaration order: for a front end that looks a
            /// parameter's states up by kind or name (the Burn crate's records).
            pub const ALL: &'static [StateKind] = &[$(StateKind::$variant,)*];

            /// PyTorch's name for it, which is also the kernel's slot name.
            pub fn torch_name(self) -> &'static str {
                match self {
                    $(StateKind::$variant => $name,)*
                }
            }
        }
    };
}

state_kinds! {
    /// Adam's first moment (Lion's running average of the gradient too).
    ExpAvg => "exp_avg",
    /// Adam's second moment.
    ExpAvgSq => "exp_avg_sq",
    /// AMSGrad's running maximum of the second moment.
    MaxExpAvgSq => "max_exp_avg_sq",
    /// SGD's momentum buffer (Muon's too).
    MomentumBuffer => "momentum_buffer",
    /// Adagrad's sum of squared gradients.
    Sum => "sum",
    /// Schedule-Free's `z`, the sequence the base optimizer steps.
    Z => "z",
    /// RMSprop's running average of the squared gradient.
    SquareAvg => "square_avg",
    /// Centered RMSprop's running average of the gradient.
    GradAvg => "grad_avg",
    /// AdEMAMix's slow EMA of the gradient (bitsandbytes keeps it as `state1[1]`).
    ExpAvgSlow => "exp_avg_slow",
    /// Adafactor's row factor of the second moment (the parameter's shape, last dim 1).
    RowVar => "row_var",
    /// Adafactor's column factor of the second moment (the parameter's shape, second-last
    /// dim 1).
    ColVar => "col_var",
    /// Adafactor's unfactored second moment of a vector.
    Variance => "variance",
    /// Adan's moment of gradient differences.
    ExpAvgDiff => "exp_avg_diff",
    /// Adan's negated previous gradient, from which the next step's difference is formed.
    NegPreGrad => "neg_pre_grad",
    /// The rounding error of the last parameter store, added back at the next step
    /// ([`Rounding::Kahan`](crate::Rounding::Kahan)); kept in the parameter's dtype. Not a
    /// state of any algorithm ([`Algorithm::state_kinds`]) but of the optimizer's rounding.
    KahanCompensation => "kahan_comp",
}
