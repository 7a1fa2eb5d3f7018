//! `multispin gen-cert`: a self-signed TLS certificate and key for a demo of `serve --tls-cert/--tls-key` and
//! `device --tls-ca` (a deployment uses certificates from its own CA).

use crate::failure::Failure;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `multispin gen-cert`.
#[derive(Debug, Args)]
pub struct GenCertArgs {
    /// DNS names and IP addresses the certificate is valid for (repeat the flag).
    #[arg(long = "name", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string()])]
    pub names: Vec<String>,
    /// Folder to write cert.pem and key.pem into (created if missing; existing files are not overwritten).
    #[arg(long, default_value = "target/tls")]
    pub out: PathBuf,
}

/// Runs `multispin gen-cert`.
pub fn run(args: &GenCertArgs) -> Result<(), Failure> {
    let (cert, key) = spin_net::tls::self_signed(&args.names).map_err(Failure::input)?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| Failure::Input(format!("out: {}: {e}", args.out.display())))?;
    for (name, text) in [("cert.pem", &cert), ("key.pem", &key)] {
        let path = args.out.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Failure::Input(format!("out: {}: {e}", path.display())))?;
        std::io::Write::write_all(&mut f, text.as_bytes())
            .map_err(|e| Failure::Runtime(anyhow::anyhow!("writing {}: {e}", path.display())))?;
    }
    eprintln!(
        "wrote {0}/cert.pem and {0}/key.pem for {1} (give the server both, the device cert.pem as --tls-ca)",
        args.out.display(),
        args.names.join(", ")
    );
    Ok(())
}
