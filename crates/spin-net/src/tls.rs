//! Transport security: TLS 1.2/1.3 with rustls on the `ring` provider for the server (certificate and key from PEM
//! files) and the device (the CA to trust and the server's name), and a self-signed certificate for demos (rcgen).
//! docs/protocol.md §"Security" says what it protects and what it does not.

use crate::error::{NetError, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::Path;
use std::sync::Arc;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(field: &str, e: impl std::fmt::Display) -> NetError {
    NetError::invalid(field, e.to_string())
}

fn certs(field: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_error(field, format!("not a PEM certificate list: {e}")))?;
    if certs.is_empty() {
        return Err(NetError::invalid(field, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// The largest PEM file read (a certificate chain, a key, the CAs to trust): 1 MiB, checked before and while
/// reading (a system's whole CA bundle is about 200 kB).
pub const MAX_PEM_BYTES: u64 = 1 << 20;

fn read(field: &str, path: &Path) -> Result<Vec<u8>> {
    spin_runtime::limits::read_limited(path, MAX_PEM_BYTES, "PEM file")
        .map_err(|e| NetError::invalid(field, e.to_string()))
}

/// The server's TLS side: accepts TLS connections with its certificate chain and key.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    /// From a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self> {
        let chain = certs("tls_cert", cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| tls_error("tls_key", format!("not a PEM private key: {e}")))?;
        let cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("tls", e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| tls_error("tls_key", format!("does not fit the certificate: {e}")))?;
        Ok(ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(cfg)),
        })
    }

    /// From the files `cert` and `key` (PEM).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self> {
        Self::from_pem(&read("tls_cert", cert)?, &read("tls_key", key)?)
    }

    /// The TLS handshake on an accepted connection.
    pub async fn accept(
        &self,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
        self.acceptor.accept(stream).await
    }
}

/// The device's TLS side: trusts the given CA certificates and checks the server's certificate names `server_name`.
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientTls({:?})", self.server_name)
    }
}

impl ClientTls {
    /// Trusting the PEM certificates `ca_pem` (a CA, or the server's self-signed certificate itself) for a server
    /// named `server_name` (a DNS name or an IP address as written in its certificate).
    pub fn from_pem(ca_pem: &[u8], server_name: &str) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs("tls_ca", ca_pem)? {
            roots
                .add(c)
                .map_err(|e| tls_error("tls_ca", format!("not a usable trust anchor: {e}")))?;
        }
        let cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("tls", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| tls_error("server_name", format!("{server_name:?}: {e}")))?;
        Ok(ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
            server_name,
        })
    }

    /// From the CA file `ca` (PEM).
    pub fn from_file(ca: &Path, server_name: &str) -> Result<Self> {
        Self::from_pem(&read("tls_ca", ca)?, server_name)
    }

    /// The TLS handshake on a connected stream; a certificate that does not verify is an error here.
    pub async fn connect(
        &self,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        self.connector.connect(self.server_name.clone(), stream).await
    }
}

/// A self-signed certificate and its key (PEM) for `names` (DNS names or IP addresses): for a demo or a test, where
/// the device is given the certificate itself as the CA to trust. A deployment uses certificates from its own CA.
pub fn self_signed(names: &[String]) -> Result<(String, String)> {
    if names.is_empty() {
        return Err(NetError::invalid(
            "names",
            "at least one DNS name or IP address is needed",
        ));
    }
    let ck = rcgen::generate_simple_self_signed(names.to_vec()).map_err(|e| tls_error("names", e))?;
    Ok((ck.cert.pem(), ck.key_pair.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pem_is_refused_naming_the_field() {
        let e = ServerTls::from_pem(b"nothing", b"nothing")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("tls_cert"), "{e}");
        let (cert, _) = self_signed(&["localhost".into()]).unwrap();
        let e = ServerTls::from_pem(cert.as_bytes(), b"x")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("tls_key"), "{e}");
        let (_, other_key) = self_signed(&["localhost".into()]).unwrap();
        let e = ServerTls::from_pem(cert.as_bytes(), other_key.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("tls_key") && e.contains("does not fit"), "{e}");
        assert!(ClientTls::from_pem(cert.as_bytes(), "not a name!").is_err());
        assert!(self_signed(&[]).is_err());
    }

    /// `/dev/zero` reports length 0 and never ends: the read stops past the limit, naming the field.
    #[cfg(unix)]
    #[test]
    fn an_endless_pem_file_is_refused_at_the_limit_naming_the_field() {
        let zero = Path::new("/dev/zero");
        let e = ClientTls::from_file(zero, "localhost").unwrap_err().to_string();
        assert_eq!(
            e,
            format!("tls_ca: /dev/zero: larger than the limit of {MAX_PEM_BYTES} bytes for a PEM file")
        );
        let e = ServerTls::from_files(zero, zero).unwrap_err().to_string();
        assert!(e.starts_with("tls_cert: /dev/zero: larger than the limit"), "{e}");
    }
}
