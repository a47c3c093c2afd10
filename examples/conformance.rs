//! Runs every conformance vector in a directory on the oracle and the GPU.
//!
//! ```text
//! cargo run --release --example conformance -- tests/vectors
//! ```
//! Reads the `*.safetensors` files directly in the directory (not its subdirectories).
//! Prints one line per case and backend, or one `refused` line for a case whose op or
//! attributes the reader does not implement, then `N cases: P passed, F failed, R refused` (a
//! case counts once, as its worst backend); exits non-zero when anything failed or was
//! refused, and with status 2, running nothing, when the directory holds no vector file.
//! A case of an op the crate does not implement yet runs on the oracle alone, against the
//! independent source, and says `oracle-checked only` on a line of its own and at the end.

use std::path::PathBuf;
use std::process::ExitCode;

use wgpu_optim::GpuContext;
use wgpu_optim_testkit::conformance::{run_case, vector_files, Backend, Case, Outcome, Tally, Verdict};

fn main() -> ExitCode {
    env_logger::init();
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: conformance DIR   (a directory of *.safetensors vector files)");
        return ExitCode::from(2);
    };
    let files = match vector_files(&dir) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let ctx = match GpuContext::headless_blocking() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    println!("adapter: {}", ctx.report());
    let mut tally = Tally::default();
    let mut oracle_only = Vec::new();
    for file in &files {
        let case = match Case::read(file) {
            Ok(case) => case,
            Err(e) => {
                println!("{:<52} {:<18} FAIL  {e}", file.display(), "-");
                tally.add(Verdict::Fail);
                continue;
            }
        };
        let name = format!("{} ({})", case.name, case.op);
        if let Err(reason) = case.check_supported() {
            tally.add(Verdict::Refused);
            println!("{name:<52} {:<18} refused  {reason}", "-");
            continue;
        }
        let mut verdict = Verdict::Pass;
        for backend in Backend::all_for(&case) {
            match run_case(&case, backend, Some(&ctx)) {
                Ok(report) => match report.outcome {
                    Outcome::Pass => {
                        println!(
                            "{name:<52} {:<18} pass  worst {:.3} of tolerance",
                            backend.name(),
                            report.worst
                        );
                    }
                    Outcome::Fail(detail) => {
                        verdict = verdict.max(Verdict::Fail);
                        println!(
                            "{name:<52} {:<18} FAIL  worst {:.3e} of tolerance: {detail}",
                            backend.name(),
                            report.worst
                        );
                    }
                    Outcome::Refused(reason) => {
                        verdict = verdict.max(Verdict::Refused);
                        println!("{name:<52} {:<18} refused  {reason}", backend.name());
                    }
                },
                Err(e) => {
                    verdict = verdict.max(Verdict::Fail);
                    println!("{name:<52} {:<18} FAIL  {e}", backend.name());
                }
            }
        }
        if case.oracle_only() {
            // The oracle alone ran: say so on the case's own line, not only in the totals.
            oracle_only.push(case.name.clone());
            println!("{name:<52} {:<18} oracle-checked only: no crate implementation yet", "gpu, cpu");
        }
        tally.add(verdict);
    }
    println!("{}", tally.closing_line());
    if !oracle_only.is_empty() {
        println!(
            "{} of them oracle-checked only (no crate implementation yet): {}",
            oracle_only.len(),
            oracle_only.join(", ")
        );
    }
    if tally.failed > 0 || tally.refused > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
