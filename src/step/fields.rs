//! One field list per uniform struct: the Rust `#[repr(C)]` Pod structs (f32 for the
//! kernels and the CPU backend, f64 for double math) and the WGSL struct declaration are all
//! generated from it, so the host and the shader cannot disagree on a field's name or place.

/// Declares a family's uniform: `$name` (f32 fields, what an f32 kernel and the CPU backend
/// read), `$wide` (the same fields in f64, what the host computes and an f64 kernel reads),
/// and `$name::wgsl`, the WGSL declaration in the shader's scalar type `S`.
macro_rules! uniform {
    (
        $(#[$doc:meta])*
        $name:ident, $wide:ident {
            $($(#[$field_doc:meta])* $field:ident,)*
        }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $name {
            $($(#[$field_doc])* pub(crate) $field: f32,)*
        }

        $(#[$doc])*
        ///
        /// In f64: the host's values before they are rounded for an f32 kernel.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $wide {
            $($(#[$field_doc])* pub(crate) $field: f64,)*
        }

        impl $name {
            /// The field names in declaration order.
            pub(crate) const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];
            /// Each field's byte offset, as `#[repr(C)]` lays it out.
            #[cfg(test)]
            pub(crate) const OFFSETS: &'static [usize] = &[$(std::mem::offset_of!($name, $field)),*];

            /// `struct NAME { field: S, ... }`: every field is a scalar of the math type, so
            /// WGSL places them exactly where `#[repr(C)]` does.
            pub(crate) fn wgsl(struct_name: &str) -> String {
                crate::step::fields::wgsl_struct(struct_name, Self::FIELDS.iter().map(|f| (*f, "S")))
            }
        }

        impl $wide {
            /// Each field's byte offset, as `#[repr(C)]` lays it out.
            #[cfg(test)]
            pub(crate) const OFFSETS: &'static [usize] = &[$(std::mem::offset_of!($wide, $field)),*];

            /// The values an f32 kernel reads: each rounded once to nearest.
            pub(crate) fn to_f32(self) -> $name {
                $name { $($field: self.$field as f32,)* }
            }
        }
    };
}

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

/// A pipeline-overridable constant: its WGSL name and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Override {
    /// A `bool` constant.
    Bool(&'static str, bool),
    /// A `u32` constant.
    U32(&'static str, u32),
}

impl Override {
    /// The declaration the generated prelude puts before the family's body.
    pub(crate) fn wgsl(self) -> String {
        match self {
            Override::Bool(name, _) => format!("override {name}: bool;\n"),
            Override::U32(name, _) => format!("override {name}: u32;\n"),
        }
    }

    /// The name and value as wgpu's pipeline constants take them.
    pub(crate) fn constant(self) -> (&'static str, f64) {
        match self {
            Override::Bool(name, value) => (name, f64::from(u8::from(value))),
            Override::U32(name, value) => (name, f64::from(value)),
        }
    }
}
