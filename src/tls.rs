//! TLS files for the server and the command-line client: read and checked when ctxd starts, so
//! a missing or bad file is one clear error naming it, not a failed handshake later.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// A client that connects and never finishes its handshake gives up its slot after this.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a TLS file was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} is not valid PEM: {detail}", path.display())]
    Pem { path: PathBuf, detail: String },
    #[error("{} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)", path.display())]
    NoKey { path: PathBuf },
    #[error("the key {} does not fit the certificate {}: {detail}", key.display(), cert.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        detail: String,
    },
    #[error("{} is not a usable CA certificate: {detail}", path.display())]
    Ca { path: PathBuf, detail: String },
}

/// The PEM text of a certificate chain and its private key, checked to belong together.
struct Pair {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// The server's TLS: its certificate and key, and with `client_ca` mutual TLS, where a client
/// must present a certificate signed by that CA.
pub fn server(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTlsConfig, Error> {
    install_provider();
    let pair = pair(cert, key)?;
    let mut config = ServerTlsConfig::new()
        .identity(Identity::from_pem(pair.cert, pair.key))
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca) = client_ca {
        config = config.client_ca_root(Certificate::from_pem(ca_roots(ca)?));
    }
    Ok(config)
}

/// The same certificate, key and client CA for the inspector's HTTPS (`--http`): a rustls
/// config that offers HTTP/1.1.
pub fn http_server(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    install_provider();
    let pair = pair(cert, key)?;
    let chain = certificates(cert, &pair.cert)?;
    let private = PrivateKeyDer::from_pem_slice(&pair.key).map_err(|e| Error::Pem {
        path: key.to_owned(),
        detail: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Pair {
            cert: cert.to_owned(),
            key: key.to_owned(),
            detail: e.to_string(),
        })?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca, &ca_roots(ca)?)? {
                roots.add(c).map_err(|e| Error::Ca {
                    path: ca.to_owned(),
                    detail: e.to_string(),
                })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| Error::Ca {
                path: ca.to_owned(),
                detail: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, private)
        .map_err(|e| Error::Pair {
            cert: cert.to_owned(),
            key: key.to_owned(),
            detail: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client's TLS: the CA to trust (the system's roots without one) and, for mutual TLS, a
/// client certificate and key.
pub fn client(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientTlsConfig, Error> {
    install_provider();
    let mut config = match ca {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_roots(ca)?)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    if let Some((cert, key)) = identity {
        let pair = pair(cert, key)?;
        config = config.identity(Identity::from_pem(pair.cert, pair.key));
    }
    Ok(config)
}

/// tonic builds its rustls configs with the process-wide provider: make it ring, the one this
/// crate compiles in. A second install is a harmless no-op.
fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|error| Error::Read {
        path: path.to_owned(),
        error,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Reads a certificate chain and its key, and checks them the way the handshake will: rustls
/// must load the key and find that it matches the certificate.
fn pair(cert_path: &Path, key_path: &Path) -> Result<Pair, Error> {
    let cert = read(cert_path)?;
    let key = read(key_path)?;
    let chain = certificates(cert_path, &cert)?;
    let private = PrivateKeyDer::from_pem_slice(&key).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => Error::NoKey {
            path: key_path.to_owned(),
        },
        e => Error::Pem {
            path: key_path.to_owned(),
            detail: e.to_string(),
        },
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, private))
        .map_err(|e| Error::Pair {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
            detail: e.to_string(),
        })?;
    Ok(Pair { cert, key })
}

/// The PEM text of a CA file, checked to hold only certificates usable as trust anchors.
fn ca_roots(path: &Path) -> Result<Vec<u8>, Error> {
    let pem = read(path)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(path, &pem)? {
        roots.add(cert).map_err(|e| Error::Ca {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    }
    Ok(pem)
}
