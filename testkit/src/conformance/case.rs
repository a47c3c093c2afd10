//! Reading one conformance case from a safetensors file, defensively: every malformed
//! field is an [`Error::BadFile`] naming the file and the field, and so is an op this
//! reader does not implement or an attribute it does not know (FORMAT.md: a case that asks
//! for something unknown, such as gradient clipping, must not run without it).

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use wgpu_optim::{DType, Error, Result};

use crate::oracle::{Storage, ToOracle};

/// Whether a case is one operator call or a multi-step optimizer run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One stateless operator call.
    Op,
    /// A stateful optimizer run for `steps` steps from zero state.
    Trajectory,
}

impl Kind {
    /// The metadata's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Op => "op",
            Kind::Trajectory => "trajectory",
        }
    }
}

/// The element type of a tensor in a vector file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    /// A float type the crate stores on the GPU.
    Float(DType),
    /// Any integer type (step counts, 8-bit codes).
    Integer,
}

/// A tensor read from a vector file, widened to f64 (exactly, for every stored type).
#[derive(Clone, Debug, PartialEq)]
pub struct CaseTensor {
    /// The stored type.
    pub dtype: ValueType,
    /// The shape (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// The values in row-major order.
    pub values: Vec<f64>,
}

/// One conformance case.
#[derive(Clone, Debug)]
pub struct Case {
    /// The file stem, e.g. `onnx_adam_t1_n1000`.
    pub name: String,
    /// Op or trajectory.
    pub kind: Kind,
    /// Which semantics, e.g. `onnx.Adam`, `dml.Adam`, `torch.AdamW`.
    pub op: String,
    /// The source's attributes or hyperparameters, under the source's own names.
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// How many tensors are optimized together.
    pub count: usize,
    /// Trajectory steps (0 for an op).
    pub steps: usize,
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// The producing implementation.
    pub source: String,
    /// Every tensor by name.
    pub tensors: BTreeMap<String, CaseTensor>,
}

/// An op with a runner of its own module (`super::own_runners`): its name, kind and every
/// attribute it understands.
pub(super) struct Op {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    pub(super) attributes: &'static [&'static str],
}

/// bitsandbytes' 8-bit Adam and AdamW attributes.
const BNB_ADAM: [&str; 6] = ["lr", "betas", "eps", "weight_decay", "min_8bit_size", "block_size"];

/// The ops that `run.rs` runs, each with its kind and every attribute it understands; the
/// ops with a module of their own bring theirs ([`Op`], [`supported`]).
const SUPPORTED: &[(&str, Kind, &[&str])] = &[
    ("bnb.Adam8bit", Kind::Trajectory, &BNB_ADAM),
    ("bnb.AdamW8bit", Kind::Trajectory, &BNB_ADAM),
    (
        "bnb.SGD8bit",
        Kind::Trajectory,
        &["lr", "momentum", "dampening", "weight_decay", "min_8bit_size", "block_size"],
    ),
    ("onnx.Adam", Kind::Op, &["alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post"]),
    ("onnx.Momentum", Kind::Op, &["alpha", "beta", "mode", "norm_coefficient"]),
    ("onnx.Adagrad", Kind::Op, &["decay_factor", "epsilon", "norm_coefficient"]),
    ("dml.Adam", Kind::Op, &["LearningRate", "Beta1", "Beta2", "Epsilon"]),
    (
        "torch.Adam",
        Kind::Trajectory,
        &["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "max_norm", "norm_type"],
    ),
    (
        "torch.AdamW",
        Kind::Trajectory,
        &["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "max_norm", "norm_type"],
    ),
    (
        "torch.SGD",
        Kind::Trajectory,
        &["lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "max_norm", "norm_type"],
    ),
    (
        "torch.Adagrad",
        Kind::Trajectory,
        &[
            "lr",
            "lr_decay",
            "weight_decay",
            "initial_accumulator_value",
            "eps",
            "maximize",
            "max_norm",
            "norm_type",
        ],
    ),
    ("lion.Lion", Kind::Trajectory, &["lr", "betas", "weight_decay", "max_norm", "norm_type"]),
    (
        "torch.RMSprop",
        Kind::Trajectory,
        &["lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize", "max_norm", "norm_type"],
    ),
    ("bnb.Lion8bit", Kind::Trajectory, &["lr", "betas", "weight_decay", "min_8bit_size", "block_size"]),
    (
        "bnb.RMSprop8bit",
        Kind::Trajectory,
        &["lr", "alpha", "eps", "weight_decay", "momentum", "centered", "min_8bit_size", "block_size"],
    ),
    (
        "bnb.AdEMAMix",
        Kind::Trajectory,
        &["lr", "betas", "alpha", "t_alpha", "t_beta3", "eps", "weight_decay", "max_norm", "norm_type"],
    ),
    (
        "bnb.AdEMAMix8bit",
        Kind::Trajectory,
        &["lr", "betas", "alpha", "t_alpha", "t_beta3", "eps", "weight_decay", "min_8bit_size", "block_size"],
    ),
];

/// Every op this reader implements, with its kind and every attribute it understands.
fn supported() -> impl Iterator<Item = (&'static str, Kind, &'static [&'static str])> {
    SUPPORTED.iter().copied().chain(super::OWN_OPS.iter().map(|op| (op.name, op.kind, op.attributes)))
}

/// The ops of [`supported`] that the crate does not implement yet: their cases run on the
/// oracle only, which checks the oracle against the independent source until the crate
/// has them, and the runners say so on every case.
const ORACLE_ONLY: &[&str] = &[];

impl Case {
    /// Reads a case file and refuses what this reader does not implement: a malformed
    /// file, an op it does not implement and an attribute it does not know are each an
    /// [`Error::BadFile`] naming the file and the field, op or attribute.
    pub fn load(path: &Path) -> Result<Case> {
        let case = Case::read(path)?;
        case.check_supported()?;
        Ok(case)
    }

    /// Reads a well-formed case file without judging its op and attributes, for a runner
    /// that reports a refusal apart from a malformed file: [`Case::check_supported`] (and
    /// [`run_case`](super::run_case), which calls it) still refuse what [`Case::load`] would.
    pub fn read(path: &Path) -> Result<Case> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| bad_file(&file, e.to_string()))?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Case::parse_format(&name, &file, &bytes)
    }

    /// [`Case::read`] from a file's bytes (a browser fetches them): a well-formed case,
    /// its op and attributes not yet judged; errors name the case `name` (the file's stem).
    pub fn read_bytes(name: &str, bytes: &[u8]) -> Result<Case> {
        Case::parse_format(name, name, bytes)
    }

    /// Parses a case from the bytes of a safetensors file, refusing as [`Case::load`] does;
    /// errors name the case `name`.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Case> {
        let case = Case::parse_format(name, name, bytes)?;
        case.check_supported()?;
        Ok(case)
    }

    /// `Ok` when this reader implements the case's op for its kind and knows each of its
    /// attributes; otherwise an [`Error::BadFile`] naming the op or every unknown attribute.
    pub fn check_supported(&self) -> Result<()> {
        let Some((_, kind, known)) = supported().find(|(op, _, _)| *op == self.op) else {
            let implemented: Vec<&str> = supported().map(|(op, _, _)| op).collect();
            return Err(self.bad(format!(
                "refused: op `{}` is not implemented by this reader (it implements {})",
                self.op,
                implemented.join(", ")
            )));
        };
        if kind != self.kind {
            return Err(self.bad(format!(
                "refused: this reader implements `{}` as {} cases, not as {} cases",
                self.op,
                kind.name(),
                self.kind.name()
            )));
        }
        let unknown: Vec<String> = self
            .attributes
            .keys()
            .filter(|a| !known.contains(&a.as_str()))
            .map(|a| format!("`{a}`"))
            .collect();
        let (noun, verb, pronoun) =
            if unknown.len() == 1 { ("attribute", "is", "it") } else { ("attributes", "are", "them") };
        if !unknown.is_empty() {
            return Err(self.bad(format!(
                "refused: {noun} {} of `{}` {verb} not known to this reader, which would run the case \
                 without {pronoun}",
                unknown.join(", "),
                self.op
            )));
        }
        Ok(())
    }

    /// Whether the case's op is checked on the oracle only, the crate having no
    /// implementation of it yet: every other backend reports it refused.
    pub fn oracle_only(&self) -> bool {
        ORACLE_ONLY.contains(&self.op.as_str())
    }

    /// Checks the format and reads every field; errors name `file`.
    fn parse_format(name: &str, file: &str, bytes: &[u8]) -> Result<Case> {
        let bad = |problem: String| bad_file(file, problem);
        let (_, metadata) =
            SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let meta = metadata.metadata().clone().unwrap_or_default();
        let field = |key: &str| meta.get(key).cloned().ok_or_else(|| bad(format!("metadata has no `{key}`")));
        let number = |key: &str| -> Result<f64> {
            field(key)?
                .trim()
                .parse::<f64>()
                .map_err(|e| bad(format!("metadata `{key}` is not a number: {e}")))
        };
        let whole = |key: &str| -> Result<usize> {
            let v = number(key)?;
            if v.fract() == 0.0 && (0.0..=1e6).contains(&v) {
                Ok(v as usize)
            } else {
                Err(bad(format!("metadata `{key}` = {v} is not a whole number in 0..=1e6")))
            }
        };
        let tolerance = |key: &str| -> Result<f64> {
            let v = number(key)?;
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(bad(format!("metadata `{key}` = {v} is not a finite number >= 0")))
            }
        };
        let format = field("format")?;
        if format != "optim-vectors/1" {
            return Err(bad(format!("format is `{format}`, expected `optim-vectors/1`")));
        }
        let kind = match field("kind")?.as_str() {
            "op" => Kind::Op,
            "trajectory" => Kind::Trajectory,
            other => return Err(bad(format!("kind is `{other}`, expected `op` or `trajectory`"))),
        };
        let attributes = match serde_json::from_str(&field("attributes")?) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => return Err(bad("`attributes` is not a JSON object".into())),
            Err(e) => return Err(bad(format!("`attributes` is not JSON: {e}"))),
        };
        let tensors_file =
            SafeTensors::deserialize(bytes).map_err(|e| bad(format!("bad tensor table: {e}")))?;
        let mut tensors = BTreeMap::new();
        for (tensor_name, view) in tensors_file.iter() {
            let tensor = widen(tensor_name, view.dtype(), view.shape(), view.data()).map_err(bad)?;
            tensors.insert(tensor_name.to_string(), tensor);
        }
        Ok(Case {
            name: name.to_string(),
            kind,
            op: field("op")?,
            attributes,
            count: whole("count")?,
            steps: if kind == Kind::Trajectory { whole("steps")? } else { 0 },
            rtol: tolerance("rtol")?,
            atol: tolerance("atol")?,
            source: meta.get("source").cloned().unwrap_or_default(),
            tensors,
        })
    }

    /// The tensor `name`, or an error naming the case.
    pub fn tensor(&self, name: &str) -> Result<&CaseTensor> {
        self.tensors.get(name).ok_or_else(|| self.bad(format!("has no tensor `{name}`")))
    }

    /// A scalar tensor's value.
    pub fn scalar(&self, name: &str) -> Result<f64> {
        match self.tensor(name)?.values.as_slice() {
            [v] => Ok(*v),
            other => Err(self.bad(format!("tensor `{name}` has {} values, expected one", other.len()))),
        }
    }

    /// A numeric attribute, or `default` when absent.
    pub fn attr_f64(&self, name: &str, default: f64) -> Result<f64> {
        match self.attributes.get(name) {
            None => Ok(default),
            Some(v) => {
                v.as_f64().ok_or_else(|| self.bad(format!("attribute `{name}` = {v} is not a number")))
            }
        }
    }

    /// A boolean attribute, or `default` when absent.
    pub fn attr_bool(&self, name: &str, default: bool) -> Result<bool> {
        match self.attributes.get(name) {
            None => Ok(default),
            Some(v) => {
                v.as_bool().ok_or_else(|| self.bad(format!("attribute `{name}` = {v} is not a boolean")))
            }
        }
    }

    /// A pair attribute such as PyTorch's `betas`, or `default` when absent.
    pub fn attr_pair(&self, name: &str, default: (f64, f64)) -> Result<(f64, f64)> {
        match self.attributes.get(name) {
            None => Ok(default),
            Some(v) => match v.as_array().map(|a| a.iter().map(|x| x.as_f64()).collect::<Vec<_>>()) {
                Some(pair) if pair.len() == 2 && pair.iter().all(Option::is_some) => {
                    Ok((pair[0].unwrap_or_default(), pair[1].unwrap_or_default()))
                }
                _ => Err(self.bad(format!("attribute `{name}` = {v} is not a pair of numbers"))),
            },
        }
    }

    /// A string attribute, or `default` when absent.
    pub fn attr_str<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str> {
        match self.attributes.get(name) {
            None => Ok(default),
            Some(v) => {
                v.as_str().ok_or_else(|| self.bad(format!("attribute `{name}` = {v} is not a string")))
            }
        }
    }

    pub(crate) fn bad(&self, problem: String) -> Error {
        bad_file(&self.name, problem)
    }
}

fn bad_file(path: &str, problem: String) -> Error {
    Error::BadFile { path: path.to_string(), problem }
}

fn widen(name: &str, dtype: Dtype, shape: &[usize], data: &[u8]) -> std::result::Result<CaseTensor, String> {
    fn read<const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
        data.chunks_exact(N).map(|c| f(c.try_into().unwrap_or([0; N]))).collect()
    }
    let (value_type, values) = match dtype {
        Dtype::F64 => (ValueType::Float(DType::F64), DType::F64.to_oracle().decode(data)),
        Dtype::F32 => (ValueType::Float(DType::F32), DType::F32.to_oracle().decode(data)),
        Dtype::F16 => (ValueType::Float(DType::F16), DType::F16.to_oracle().decode(data)),
        Dtype::BF16 => (ValueType::Float(DType::BF16), DType::BF16.to_oracle().decode(data)),
        Dtype::I64 => (ValueType::Integer, read(data, |b| i64::from_le_bytes(b) as f64)),
        Dtype::I32 => (ValueType::Integer, read(data, |b| f64::from(i32::from_le_bytes(b)))),
        Dtype::U32 => (ValueType::Integer, read(data, |b| f64::from(u32::from_le_bytes(b)))),
        Dtype::U64 => (ValueType::Integer, read(data, |b| u64::from_le_bytes(b) as f64)),
        Dtype::I16 => (ValueType::Integer, read(data, |b| f64::from(i16::from_le_bytes(b)))),
        Dtype::U16 => (ValueType::Integer, read(data, |b| f64::from(u16::from_le_bytes(b)))),
        Dtype::I8 => (ValueType::Integer, read(data, |b| f64::from(i8::from_le_bytes(b)))),
        Dtype::U8 => (ValueType::Integer, read(data, |b| f64::from(u8::from_le_bytes(b)))),
        other => return Err(format!("tensor `{name}` has unsupported dtype {other:?}")),
    };
    let elements: usize = shape.iter().product();
    if values.len() != elements {
        return Err(format!("tensor `{name}` has {} values for shape {shape:?}", values.len()));
    }
    Ok(CaseTensor { dtype: value_type, shape: shape.to_vec(), values })
}
