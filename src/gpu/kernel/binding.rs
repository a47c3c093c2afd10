use std::fmt::Write;

/// Bind group 0 of every pass: its scalars (hyperparameters, device state, clip buffer,
/// norm partials); the only group of the passes without a table.
pub(crate) const GROUP_SCALARS: u32 = 0;
/// Bind group 1 of the update kernels (multi-tensor and 8-bit): the dispatch's table and
/// tensor bindings, one bind group per dispatch.
pub(crate) const GROUP_TABLE: u32 = 1;

/// Group 0 of update kernels (8-bit ones too): the hyperparameter uniform slot.
pub(crate) const HYPER: u32 = 0;
/// Group 0 of capturable update kernels: the device state (step counter, AMP flag, clip
/// coefficient), read.
pub(crate) const DEVICE_STATE: u32 = 1;
/// Group 0 of capturable update kernels: the group's learning rate, one f32.
pub(crate) const DEVICE_LR: u32 = 2;
/// Group 0 of host-scalar update kernels that clip (8-bit ones too): the clip buffer,
/// read.
pub(crate) const CLIP: u32 = 3;
/// Group 0 of the unscale passes and of the step-advancing kernel (one layout serves
/// both): the device state, read-write.
pub(crate) const DEVICE_STATE_RW: u32 = 0;
/// Group 0 of the gradient-norm pass: one partial norm per workgroup, written.
pub(crate) const NORM_PARTIALS: u32 = 0;
/// Group 0 of the pass that unscales and takes partial norms: the partials, written.
pub(crate) const UNSCALE_NORM_PARTIALS: u32 = 1;
/// Group 0 of the clip finalize pass: the partial norms, read.
pub(crate) const FINALIZE_PARTIALS: u32 = 0;
/// Group 0 of the clip finalize pass: the clip buffer, written.
pub(crate) const FINALIZE_CLIP: u32 = 1;
/// Group 0 of the clip finalize pass in capturable mode: the device state, written
/// (the coefficient, for capturable update kernels).
pub(crate) const FINALIZE_DEVICE_STATE: u32 = 2;
/// Group 0 of a family's table passes (`Scalars::Passes`): one partial per workgroup,
/// written by the pass that folds them (read by the family's pass that combines them).
pub(crate) const PASS_PARTIALS: u32 = 4;
/// Group 0 of a family's table passes: the index buffer the family lays out, read by the
/// table passes (written by the family's pass that combines the partials).
pub(crate) const PASS_INDEX: u32 = 5;
/// Group 1: the dispatch's table (a uniform), multi-tensor and 8-bit alike.
pub(crate) const TABLE: u32 = 0;
/// Group 1: the first tensor binding; storage binding `b` of a layout is `TENSORS + b`.
pub(crate) const TENSORS: u32 = 1;
/// Group 1 of 8-bit kernels: the parameters, read and written.
pub(crate) const Q8_PARAMS: u32 = 1;
/// Group 1 of 8-bit kernels: the gradients, read, where they are not in the parameters'
/// buffer.
pub(crate) const Q8_GRADS: u32 = 2;
/// Group 1 of 8-bit kernels: the state arena, read and written.
pub(crate) const Q8_STATE: u32 = 3;
/// Group 1 of 8-bit kernels with 8-bit states: the code tables, read.
pub(crate) const Q8_CODE_TABLES: u32 = 4;

// Pipeline layouts list their bind group layouts in group order (`gpu/pipeline.rs`, the
// clip and advance passes in `optimizer/`), so the numbers must be these.
const _: () = assert!(GROUP_SCALARS == 0 && GROUP_TABLE == 1);

/// Every constant with its WGSL name.
const ALL: [(&str, u32); 20] = [
    ("GROUP_SCALARS", GROUP_SCALARS),
    ("GROUP_TABLE", GROUP_TABLE),
    ("BINDING_HYPER", HYPER),
    ("BINDING_DEVICE_STATE", DEVICE_STATE),
    ("BINDING_DEVICE_LR", DEVICE_LR),
    ("BINDING_CLIP", CLIP),
    ("BINDING_DEVICE_STATE_RW", DEVICE_STATE_RW),
    ("BINDING_NORM_PARTIALS", NORM_PARTIALS),
    ("BINDING_UNSCALE_NORM_PARTIALS", UNSCALE_NORM_PARTIALS),
    ("BINDING_FINALIZE_PARTIALS", FINALIZE_PARTIALS),
    ("BINDING_FINALIZE_CLIP", FINALIZE_CLIP),
    ("BINDING_FINALIZE_DEVICE_STATE", FINALIZE_DEVICE_STATE),
    ("BINDING_PASS_PARTIALS", PASS_PARTIALS),
    ("BINDING_PASS_INDEX", PASS_INDEX),
    ("BINDING_TABLE", TABLE),
    ("BINDING_TENSORS", TENSORS),
    ("BINDING_Q8_PARAMS", Q8_PARAMS),
    ("BINDING_Q8_GRADS", Q8_GRADS),
    ("BINDING_Q8_STATE", Q8_STATE),
    ("BINDING_Q8_CODE_TABLES", Q8_CODE_TABLES),
];

/// `const BINDING_<NAME>: u32` for every constant of this module.
pub(crate) fn binding_wgsl() -> String {
    let mut s = String::new();
    for (name, value) in ALL {
        let _ = writeln!(s, "const {name}: u32 = {value}u;");
    }
    s
}
