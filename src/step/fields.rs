//! One field list per uniform struct: the Rust `#[repr(C)]` Pod structs (f32 for the
//! kernels and the CPU backend, f64 for double math) and the WGSL struct declaration are all
//! generated from it, so the host and the shader cannot disagree on a field's name or place.

/// Declares a family's uniform: `$name` (f32 fields, what an f32 kernel and the CPU backend
/// read), `$wide` (the same fields in f64, what the host computes and an f64 kernel reads),
/// and `$name::wgsl`, the WGSL declaration in the shader's scalar type `S`.
///
/// Flags (on/off values the kernel tests at run time) follow the scalars as `u32` fields,
/// 0 or 1, in both structs and in WGSL. In `$wide` they must come in pairs (a `reserved`
/// flag pads an odd count), or its `Pod` derive finds padding before the struct's end.
macro_rules! uniform {
    (
        $(#[$doc:meta])*
        $name:ident, $wide:ident {
            $($(#[$field_doc:meta])* $field:ident,)*
        }
        $(flags {
            $($(#[$flag_doc:meta])* $flag:ident,)*
        })?
    ) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $name {
            $($(#[$field_doc])* pub(crate) $field: f32,)*
            $($($(#[$flag_doc])* pub(crate) $flag: u32,)*)?
        }

        $(#[$doc])*
        ///
        /// In f64: the host's values before they are rounded for an f32 kernel.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $wide {
            $($(#[$field_doc])* pub(crate) $field: f64,)*
            $($($(#[$flag_doc])* pub(crate) $flag: u32,)*)?
        }

        impl $name {
            /// The field names in declaration order, flags last.
            pub(crate) const FIELDS: &'static [&'static str] =
                &[$(stringify!($field),)* $($(stringify!($flag),)*)?];
            /// The flags among [`Self::FIELDS`]: `u32` where the others are scalars.
            const FLAGS: &'static [&'static str] = &[$($(stringify!($flag),)*)?];
            /// Each field's byte offset, as `#[repr(C)]` lays it out.
            #[cfg(test)]
            pub(crate) const OFFSETS: &'static [usize] =
                &[$(std::mem::offset_of!($name, $field),)* $($(std::mem::offset_of!($name, $flag),)*)?];

            /// `struct NAME { field: S, ..., flag: u32, ... }`: scalars of the math type, then
            /// 4-byte flags, so WGSL places every field exactly where `#[repr(C)]` does.
            pub(crate) fn wgsl(struct_name: &str) -> String {
                let ty = |f: &&'static str| if Self::FLAGS.contains(f) { "u32" } else { "S" };
                crate::step::fields::wgsl_struct(struct_name, Self::FIELDS.iter().map(|f| (*f, ty(f))))
            }
        }

        impl $wide {
            /// Each field's byte offset, as `#[repr(C)]` lays it out.
            #[cfg(test)]
            pub(crate) const OFFSETS: &'static [usize] =
                &[$(std::mem::offset_of!($wide, $field),)* $($(std::mem::offset_of!($wide, $flag),)*)?];

            /// The values an f32 kernel reads: each scalar rounded once to nearest.
            pub(crate) fn to_f32(self) -> $name {
                $name { $($field: self.$field as f32,)* $($($flag: self.$flag,)*)? }
            }
        }
    };
}

/// A field type of a [`shader_struct!`]: its WGSL spelling, and the alignment WGSL gives it
/// in a uniform (a field at an offset of that alignment lies where `#[repr(C)]` puts it).
pub(crate) trait ShaderField {
    /// The WGSL type.
    const WGSL: &'static str;
    /// Its alignment in WGSL, in bytes.
    const ALIGN: usize;
}

impl ShaderField for u32 {
    const WGSL: &'static str = "u32";
    const ALIGN: usize = 4;
}

impl ShaderField for f32 {
    const WGSL: &'static str = "f32";
    const ALIGN: usize = 4;
}

impl ShaderField for [u32; 2] {
    const WGSL: &'static str = "vec2<u32>";
    const ALIGN: usize = 8;
}

impl ShaderField for [u32; 4] {
    const WGSL: &'static str = "vec4<u32>";
    const ALIGN: usize = 16;
}

/// Declares a `#[repr(C)]` Pod struct of `u32`, `f32` and `[u32; 2]` fields that host and
/// kernels share, whole `vec4<u32>` rows of it: the multi-tensor table's head and rows, the
/// 8-bit table's segments, and the headers of the clip, device-state and rounding buffers.
/// It gets `NAME` (the same in WGSL), `FIELDS`, `OFFSETS`, `ROWS`, `words()` (what the host
/// writes), `wgsl()` (the WGSL struct, `[u32; 2]` as `vec2<u32>`), `wgsl_with(field, ty)`
/// (the same with one field's type replaced, e.g. by an atomic) and `reader_wgsl(fn_name)`
/// (the WGSL function that reads one from a table's rows). Further derives (`Default`,
/// `Eq`) go with the doc attributes.
/// Compile-time checks: the struct is whole rows, and every `vec2` field lies at a multiple
/// of 8, where WGSL puts it too.
macro_rules! shader_struct {
    (
        $(#[$doc:meta])*
        $name:ident {
            $($(#[$field_doc:meta])* $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $name {
            $($(#[$field_doc])* pub(crate) $field: $ty,)*
        }

        const _: () = {
            assert!(std::mem::size_of::<$name>() % 16 == 0, "a shader struct is whole vec4<u32> rows");
            $(assert!(
                std::mem::offset_of!($name, $field) % <$ty as crate::step::fields::ShaderField>::ALIGN == 0,
                "a field lies where WGSL aligns it"
            );)*
        };

        impl $name {
            /// The struct's name, in Rust and in WGSL.
            pub(crate) const NAME: &'static str = stringify!($name);
            /// The field names in declaration order.
            pub(crate) const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];
            /// Each field's WGSL type.
            const TYPES: &'static [&'static str] =
                &[$(<$ty as crate::step::fields::ShaderField>::WGSL),*];
            /// Each field's byte offset, as `#[repr(C)]` lays it out.
            #[allow(dead_code)] // The table's head is read in place (`table.head`): no reader.
            pub(crate) const OFFSETS: &'static [usize] = &[$(std::mem::offset_of!($name, $field)),*];
            /// `vec4<u32>` rows the struct takes.
            #[allow(dead_code)] // As `OFFSETS`.
            pub(crate) const ROWS: usize = std::mem::size_of::<$name>() / 16;

            /// The struct's words, in field order.
            #[allow(dead_code)] // The headers are written as bytes.
            pub(crate) fn words(self) -> [u32; std::mem::size_of::<$name>() / 4] {
                bytemuck::cast(self)
            }

            /// `struct $name { field: type, ... }` in WGSL.
            pub(crate) fn wgsl() -> String {
                let fields = Self::FIELDS.iter().copied().zip(Self::TYPES.iter().copied());
                crate::step::fields::wgsl_struct(Self::NAME, fields)
            }

            /// [`Self::wgsl`] with `field`'s type spelled `ty` (same size and alignment: an
            /// atomic where one pass writes the field from many invocations).
            #[allow(dead_code)] // Only the device state's `found_inf` needs it.
            pub(crate) fn wgsl_with(field: &str, ty: &str) -> String {
                let fields = Self::FIELDS
                    .iter()
                    .copied()
                    .zip(Self::TYPES.iter().copied())
                    .map(|(name, t)| (name, if name == field { ty } else { t }));
                crate::step::fields::wgsl_struct(Self::NAME, fields)
            }

            /// `fn fn_name(r: u32) -> $name`: the struct from rows `r..r + ROWS` of `table.rows`
            /// ([`crate::step::fields::table_reader_wgsl`]).
            #[allow(dead_code)] // As `OFFSETS`.
            pub(crate) fn reader_wgsl(fn_name: &str) -> String {
                crate::step::fields::table_reader_wgsl(fn_name, Self::NAME, Self::TYPES, Self::OFFSETS)
            }
        }
    };
}

pub(crate) use shader_struct;
pub(crate) use uniform;

/// A WGSL struct declaration from `(name, type)` pairs.
pub(crate) fn wgsl_struct<'a>(name: &str, fields: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut s = format!("struct {name} {{\n");
    for (field, ty) in fields {
        s.push_str(&format!("    {field}: {ty},\n"));
    }
    s.push_str("}\n");
    s
}

/// `fn fn_name(r: u32) -> name`: the struct `name` (declared by [`shader_struct!`], whose
/// fields have the WGSL `types` at the byte `offsets`) from rows `r`, `r + 1u`, ... of the
/// `vec4<u32>` array `table.rows`: the field at byte `o` is lane `o % 16 / 4` (and the next,
/// for a `vec2`) of row `o / 16`, which is where `#[repr(C)]` puts it in the words the host
/// writes.
pub(crate) fn table_reader_wgsl(fn_name: &str, name: &str, types: &[&str], offsets: &[usize]) -> String {
    const LANES: &str = "xyzw";
    let rows = offsets.iter().map(|o| o / 16 + 1).max().unwrap_or(0);
    let mut s = format!("fn {fn_name}(r: u32) -> {name} {{\n");
    for row in 0..rows {
        let at = if row == 0 { String::new() } else { format!(" + {row}u") };
        s.push_str(&format!("    let r{row} = table.rows[r{at}];\n"));
    }
    let fields: Vec<String> = types
        .iter()
        .zip(offsets)
        .map(|(ty, o)| {
            let lane = o % 16 / 4;
            let width = if ty.starts_with("vec2") {
                2
            } else if ty.starts_with("vec4") {
                4
            } else {
                1
            };
            format!("r{}.{}", o / 16, &LANES[lane..lane + width])
        })
        .collect();
    s.push_str(&format!("    return {name}({});\n}}\n", fields.join(", ")));
    s
}

/// A pipeline-overridable constant: its WGSL name and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Override {
    /// A `bool` constant.
    Bool(&'static str, bool),
    /// A `u32` constant that takes one of a set of named values: each value is declared as a
    /// WGSL `const` of its name, which the shader compares the override against.
    Choice(&'static str, u32, &'static [(&'static str, u32)]),
}

impl Override {
    /// The declaration the generated prelude puts before the family's body.
    pub(crate) fn wgsl(self) -> String {
        match self {
            Override::Bool(name, _) => format!("override {name}: bool;\n"),
            Override::Choice(name, _, choices) => {
                let mut s = String::new();
                for (choice, value) in choices {
                    s.push_str(&format!("const {choice}: u32 = {value}u;\n"));
                }
                s + &format!("override {name}: u32;\n")
            }
        }
    }

    /// The name and value as wgpu's pipeline constants take them.
    pub(crate) fn constant(self) -> (&'static str, f64) {
        match self {
            Override::Bool(name, value) => (name, f64::from(u8::from(value))),
            Override::Choice(name, value, _) => (name, f64::from(value)),
        }
    }
}
