//! Careless input on every family and storage, on both backends: the steps the backends
//! refuse, a gradient of the wrong length among them (`refusals`); zero-size tensors
//! anywhere (`empty`); NaN and infinity in one gradient element (`nonfinite`, against the
//! f64 oracle's run in `oracle`, and the table in `docs/non-finite.md`). The GPU runs share
//! one context whose uncaptured-error handler records every error, and each test asserts
//! that none reached it.

mod cases;
mod empty;
mod nonfinite;
mod oracle;
mod refusals;
