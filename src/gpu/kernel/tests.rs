use super::*;
use crate::step::clip::NormType;
use crate::step::device::DeviceHeader;
use crate::step::rounding::{RoundingHeader, Stochastic};
use crate::step::{Override, Slot, Switches};
use crate::{DType, StateKind};

/// Every slot bound, in place, each state in a binding of its own, the model copy too;
/// the Kahan compensation only with `kahan`.
fn layout(program: Program, storage: Storage, kahan: bool) -> BindingLayout {
    let bound = |slot: &Slot| kahan || *slot != Slot::State(StateKind::KahanCompensation);
    let inputs: Vec<Option<usize>> =
        program.inputs().iter().enumerate().map(|(k, slot)| bound(slot).then_some(k)).collect();
    let outputs = program
        .outputs()
        .iter()
        .map(|slot| {
            bound(slot).then(|| program.inputs().iter().position(|s| s == slot).unwrap_or(inputs.len()))
        })
        .collect();
    let bindings = vec![BindingDesc { storage, read_write: true }; inputs.len() + 1];
    BindingLayout { inputs, outputs, bindings }
}

/// The store variants of 16-bit storage: nearest even, Kahan, stochastic parameters,
/// stochastic parameters and state.
fn store_variants(program: Program, storage: Storage) -> Vec<(bool, Stochastic)> {
    let nearest = (false, Stochastic::default());
    if !matches!(program, Program::Update(_)) || storage.dtype().size() != 2 {
        return vec![nearest];
    }
    vec![
        nearest,
        (true, Stochastic::default()),
        (false, Stochastic { params: true, state: false }),
        (false, Stochastic { params: true, state: true }),
    ]
}

/// `(name, offset)` of each member of the struct `name` in a parsed module (the 8-bit
/// kernels' naga test uses it too).
pub(crate) fn members(module: &naga::Module, name: &str) -> Vec<(String, u32)> {
    let found = module.types.iter().find(|(_, ty)| ty.name.as_deref() == Some(name));
    match found.map(|(_, ty)| &ty.inner) {
        Some(naga::TypeInner::Struct { members, .. }) => {
            members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset)).collect()
        }
        other => panic!("no struct {name} in the module ({other:?})"),
    }
}

/// `(name, (group, binding))` of every resource of a parsed module, sorted.
pub(crate) fn resource_bindings(module: &naga::Module) -> Vec<(String, (u32, u32))> {
    let mut found: Vec<(String, (u32, u32))> = module
        .global_variables
        .iter()
        .filter_map(|(_, g)| {
            let b = g.binding.as_ref()?;
            Some((g.name.clone().unwrap_or_default(), (b.group, b.binding)))
        })
        .collect();
    found.sort();
    found
}

/// The value of the `u32` constant `name` of a parsed module.
fn u32_constant(module: &naga::Module, name: &str) -> Option<u32> {
    let (_, constant) = module.constants.iter().find(|(_, c)| c.name.as_deref() == Some(name))?;
    match module.global_expressions[constant.init] {
        naga::Expression::Literal(naga::Literal::U32(v)) => Some(v),
        _ => None,
    }
}

/// The resources a variant's WGSL should bind, at the numbers the host binds them.
fn expected_bindings(key: &VariantKey) -> Vec<(String, (u32, u32))> {
    let mut expected = vec![("table".to_string(), (binding::GROUP_TABLE, binding::TABLE))];
    for b in 0..key.layout.bindings.len() {
        expected.push((format!("buf{b}"), (binding::GROUP_TABLE, binding::TENSORS + b as u32)));
    }
    let hyper = if key.stochastic.any() { "hp_slot" } else { "hp_base" };
    let group0: &[(&str, u32)] = match key.scalars {
        Scalars::Host => &[(hyper, binding::HYPER)],
        Scalars::Device => &[
            (hyper, binding::HYPER),
            ("device_state", binding::DEVICE_STATE),
            ("device_lr", binding::DEVICE_LR),
        ],
        Scalars::Unscale => &[("device_state", binding::DEVICE_STATE_RW)],
        Scalars::Norm => &[("partials", binding::NORM_PARTIALS)],
        Scalars::UnscaleNorm => {
            &[("device_state", binding::DEVICE_STATE_RW), ("partials", binding::UNSCALE_NORM_PARTIALS)]
        }
        Scalars::Passes(_) => &[
            (hyper, binding::HYPER),
            ("pass_partials", binding::PASS_PARTIALS),
            ("pass_index", binding::PASS_INDEX),
        ],
    };
    expected.extend(group0.iter().map(|(name, b)| (name.to_string(), (binding::GROUP_SCALARS, *b))));
    if key.clip && key.scalars == Scalars::Host {
        expected.push(("clip_state".to_string(), (binding::GROUP_SCALARS, binding::CLIP)));
    }
    expected.sort();
    expected
}

/// The size of the struct `name` in a parsed module.
fn struct_span(module: &naga::Module, name: &str) -> u32 {
    let found = module.types.iter().find(|(_, ty)| ty.name.as_deref() == Some(name));
    match found.map(|(_, ty)| &ty.inner) {
        Some(naga::TypeInner::Struct { span, .. }) => *span,
        other => panic!("no struct {name} in the module ({other:?})"),
    }
}

fn rust_members(fields: &[&str], offsets: &[usize]) -> Vec<(String, u32)> {
    fields.iter().zip(offsets).map(|(f, o)| (f.to_string(), *o as u32)).collect()
}

#[test]
fn the_clip_finalize_and_advance_passes_validate_and_bind_by_the_named_numbers() {
    let mut validator =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    let parse = |source: &str| {
        naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{}\n{source}", e.emit_to_string(source)))
    };
    for capturable in [false, true] {
        let source = clip_finalize_wgsl(capturable);
        let module = parse(&source);
        validator.validate(&module).unwrap_or_else(|e| panic!("{e:?}\n{source}"));
        let mut expected = vec![
            ("clip".to_string(), (binding::GROUP_SCALARS, binding::FINALIZE_CLIP)),
            ("partials".to_string(), (binding::GROUP_SCALARS, binding::FINALIZE_PARTIALS)),
        ];
        if capturable {
            expected
                .push(("device_state".to_string(), (binding::GROUP_SCALARS, binding::FINALIZE_DEVICE_STATE)));
        }
        expected.sort();
        assert_eq!(resource_bindings(&module), expected, "capturable: {capturable}");
        assert_eq!(module.entry_points[0].workgroup_size, [WORKGROUP_SIZE, 1, 1]);
        let header = [("total_norm", 0), ("coefficient", 4), ("max_norm", 8), ("reserved", 12)]
            .map(|(n, o)| (n.to_string(), o));
        assert_eq!(members(&module, "ClipHeader"), header);
    }
    let source = advance_wgsl();
    let module = parse(&source);
    validator.validate(&module).unwrap_or_else(|e| panic!("{e:?}\n{source}"));
    assert_eq!(
        resource_bindings(&module),
        [("state".to_string(), (binding::GROUP_SCALARS, binding::DEVICE_STATE_RW))]
    );
}

/// No WGSL file (of `shaders/` and of each family's folder) writes a binding number or a
/// workgroup size as a literal: each comes from a constant the prelude generates.
#[test]
fn shader_files_bind_and_size_workgroups_by_name() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
        entries.map(|e| e.unwrap_or_else(|e| panic!("{e}")).path()).collect()
    };
    let mut paths = read(&std::path::Path::new(root).join("shaders"));
    for family in read(&std::path::Path::new(root).join("src/family")).iter().filter(|p| p.is_dir()) {
        paths.extend(read(family).into_iter().filter(|p| p.extension().is_some_and(|e| e == "wgsl")));
    }
    let mut files = 0;
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        for attribute in ["@binding(", "@workgroup_size("] {
            for (at, _) in text.match_indices(attribute) {
                let next = text[at + attribute.len()..].chars().next();
                // The step counter's one invocation is the only literal size.
                let single = text[at..].starts_with("@workgroup_size(1)");
                assert!(!next.is_some_and(|c| c.is_ascii_digit()) || single, "{path:?}: {}", &text[at..]);
            }
        }
        files += 1;
    }
    assert!(files > 20, "{files} shader files");
}

#[test]
fn every_variant_validates_and_its_structs_lay_out_as_the_rust_ones() {
    let mut validator =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    let mut programs: Vec<Program> = Switches::every().into_iter().map(Program::Update).collect();
    programs.extend([
        Program::Unscale,
        Program::GradNorm(NormType::L2),
        Program::GradNorm(NormType::Inf),
        Program::UnscaleNorm(NormType::L2),
        Program::UnscaleNorm(NormType::Inf),
    ]);
    let storages = [
        Storage::Native(DType::F32),
        Storage::Native(DType::F16),
        Storage::Packed(DType::F16),
        Storage::Packed(DType::BF16),
    ];
    for program in programs {
        let pairings =
            [Scalars::Host, Scalars::Device, Scalars::Unscale, Scalars::Norm, Scalars::UnscaleNorm]
                .into_iter()
                .filter(|scalars| match program {
                    Program::Update(_) => matches!(scalars, Scalars::Host | Scalars::Device),
                    Program::Unscale => *scalars == Scalars::Unscale,
                    Program::GradNorm(_) => *scalars == Scalars::Norm,
                    Program::UnscaleNorm(_) => *scalars == Scalars::UnscaleNorm,
                })
                // Schedule-Free, Muon (refused when the optimizer is built), and the families
                // without an elementwise update have no capturable form.
                .filter(|scalars| !(program.capturable_source().is_empty() && *scalars == Scalars::Device))
                .flat_map(|scalars| {
                    let clips: &[bool] =
                        if matches!(program, Program::Update(_)) { &[false, true] } else { &[false] };
                    clips.iter().map(move |clip| (scalars, *clip))
                });
        for (scalars, clip) in pairings {
            for (math, storage, width) in storages
                .iter()
                .flat_map(|s| [(DType::F32, *s, 1), (DType::F32, *s, 4)])
                .chain([(DType::F64, Storage::Native(DType::F64), 1)])
            {
                // Capturable math is f32, and the unscale pass runs one element at a time.
                if (math == DType::F64 && scalars != Scalars::Host)
                    || (width == 4 && matches!(program, Program::Unscale | Program::UnscaleNorm(_)))
                {
                    continue;
                }
                for (kahan, stochastic) in store_variants(program, storage) {
                    let layout = layout(program, storage, kahan);
                    let key = VariantKey { scalars, program, math, layout, width, stochastic, clip };
                    let source = compose(&key);
                    if kahan {
                        assert!(source.contains("store_kahan_comp(i, select("), "{key:?}");
                    }
                    if stochastic.any() {
                        assert!(source.contains("_sr") && source.contains("rng_begin(e, "), "{key:?}");
                    } else {
                        assert!(!source.contains("rng_begin"), "{key:?}");
                    }
                    let module = naga::front::wgsl::parse_str(&source)
                        .unwrap_or_else(|e| panic!("{key:?}: {}\n{source}", e.emit_to_string(&source)));
                    validator.validate(&module).unwrap_or_else(|e| panic!("{key:?}: {e:?}\n{source}"));
                    if let Program::Update(switches) = program {
                        let (fields, offsets) = switches.uniform_layout(math);
                        let expected = rust_members(fields, offsets);
                        assert_eq!(members(&module, "Hyper"), expected, "{key:?}");
                    }
                    assert_eq!(resource_bindings(&module), expected_bindings(&key), "{key:?}");
                    for choices in program.overrides().into_iter().filter_map(|o| match o {
                        Override::Choice(_, _, choices) => Some(choices),
                        Override::Bool(..) => None,
                    }) {
                        for (name, value) in choices {
                            assert_eq!(u32_constant(&module, name), Some(*value), "{key:?}");
                        }
                    }
                    let table_rows = [
                        ("TableHead", rust_members(TableHead::FIELDS, TableHead::OFFSETS)),
                        ("TableRow", rust_members(TableRow::FIELDS, TableRow::OFFSETS)),
                    ];
                    for (name, expected) in table_rows {
                        assert_eq!(members(&module, name), expected, "{key:?}");
                    }
                    let head = std::mem::size_of::<TableHead>() as u32;
                    let table = [("head".to_string(), 0), ("rows".to_string(), head)];
                    assert_eq!(members(&module, "Table"), table, "{key:?}");
                    assert_eq!(u64::from(struct_span(&module, "Table")), TABLE_BYTES, "{key:?}");
                    if clip && scalars == Scalars::Host {
                        let header =
                            [("total_norm", 0), ("coefficient", 4), ("max_norm", 8), ("reserved", 12)]
                                .map(|(n, o)| (n.to_string(), o));
                        assert_eq!(members(&module, "ClipHeader"), header, "{key:?}");
                    }
                    if matches!(scalars, Scalars::Device | Scalars::Unscale | Scalars::UnscaleNorm) {
                        let header = [
                            ("step", DeviceHeader::STEP),
                            ("found_inf", DeviceHeader::FOUND_INF),
                            ("inv_scale", DeviceHeader::INV_SCALE),
                            ("clip_coefficient", DeviceHeader::CLIP_COEFFICIENT),
                        ]
                        .map(|(n, o)| (n.to_string(), o as u32));
                        assert_eq!(members(&module, "DeviceHeader"), header, "{key:?}");
                    }
                    if stochastic.any() {
                        let fields = [("seed_lo", 0u32), ("seed_hi", 4), ("step", 8), ("reserved", 12)];
                        let fields = fields.map(|(n, o)| (n.to_string(), o));
                        assert_eq!(members(&module, "RoundingHeader"), fields, "{key:?}");
                        assert_eq!(
                            members(&module, "RngRow"),
                            rust_members(RngRow::FIELDS, RngRow::OFFSETS),
                            "{key:?}"
                        );
                        let slot = members(&module, "HyperSlot");
                        assert_eq!(
                            slot.last(),
                            Some(&("rounding".to_string(), RoundingHeader::OFFSET as u32)),
                            "{key:?}"
                        );
                    }
                }
            }
        }
    }
}
