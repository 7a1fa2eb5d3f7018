//! Writes a Hugging Face model folder (a distilled draft with its restricted head too) as a GGUF file with Q8_0
//! matrices, which starts in a few milliseconds where the folder's f32 weights are read and quantised at every
//! start (docs/runtime.md, "Start-up"; `scripts/build-smollm2-draft.sh` runs it).
//!
//! `cargo run --release -p spin-runtime --example to_gguf -- DIR OUT.gguf`

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(out), None) = (args.next(), args.next(), args.next()) else {
        eprintln!("usage: to_gguf DIR OUT.gguf");
        return ExitCode::from(2);
    };
    let start = std::time::Instant::now();
    match spin_runtime::gguf::write_from_dir(
        std::path::Path::new(&dir),
        std::path::Path::new(&out),
        spin_runtime::gguf::GgmlDType::Q8_0,
    ) {
        Ok(()) => {
            println!("wrote {out} in {:.1} s", start.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
