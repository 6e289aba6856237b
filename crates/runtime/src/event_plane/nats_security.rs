//! How the NATS client proves itself and checks the server: TLS (`--nats-tls-*`), and one of
//! user and password, token, NKey seed ([`crate::config::credentials`]) or a credentials file
//! (`--nats-auth-credentials-file`). User and password may also ride in the `NATS_SERVER` URL
//! (`nats://user:password@host:4222`), which async-nats reads itself.
//!
//! The certificate files are read again at every (re)connect, so a renewed client certificate is
//! presented the next time the connection is made. With TLS configured the client requires it:
//! a server that does not offer TLS is refused rather than spoken to in plaintext.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::config::credentials::NatsAuth;
use crate::{Error, Result};

/// TLS and credentials of the NATS client (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct NatsSecurity {
    /// PEM CA that verifies the server; the client then requires TLS.
    pub ca: Option<PathBuf>,
    /// PEM certificate and key presented to the server.
    pub client: Option<(PathBuf, PathBuf)>,
    /// Accept any server certificate (development only; still encrypted).
    pub insecure: bool,
    /// User and password, token or NKey seed.
    pub auth: NatsAuth,
    /// Credentials file (user JWT and NKey seed).
    pub credentials_file: Option<PathBuf>,
}

impl NatsSecurity {
    /// Whether the client must speak TLS.
    pub fn requires_tls(&self) -> bool {
        self.ca.is_some() || self.client.is_some() || self.insecure
    }

    /// Adds TLS and credentials to `options`.
    pub async fn apply(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions> {
        let config_error =
            |what: &str, error: &dyn std::fmt::Display| Error::Config(format!("{what}: {error}"));
        if let Some(path) = &self.credentials_file {
            if self.auth != NatsAuth::None {
                return Err(Error::Config(
                    "--nats-auth-credentials-file (NATS_AUTH_CREDENTIALS_FILE): set either it or NATS_AUTH_USERNAME/NATS_AUTH_TOKEN/NATS_AUTH_NKEY".into(),
                ));
            }
            options = options.credentials_file(path).await.map_err(|e| {
                config_error(
                    &format!(
                        "--nats-auth-credentials-file (NATS_AUTH_CREDENTIALS_FILE) {}",
                        path.display()
                    ),
                    &e,
                )
            })?;
        }
        options = match &self.auth {
            NatsAuth::None => options,
            NatsAuth::UserPassword(user, password) => {
                options.user_and_password(user.clone(), password.clone())
            }
            NatsAuth::Token(token) => options.token(token.clone()),
            NatsAuth::NKey(seed) => options.nkey(seed.clone()),
        };
        if !self.requires_tls() {
            return Ok(options);
        }
        options = options.require_tls(true);
        if self.insecure {
            return Ok(options.tls_client_config(self.insecure_config()?));
        }
        if let Some(ca) = &self.ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.client {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options)
    }

    /// A configuration that accepts any server certificate but still presents the client's.
    fn insecure_config(&self) -> Result<rustls::ClientConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("--nats-tls-insecure: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
        match &self.client {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let flag = "--nats-tls-client-cert-path (NATS_TLS_CLIENT_CERT_PATH)";
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                    .map_err(|e| Error::Config(format!("{flag} {}: {e}", cert.display())))?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    Error::Config(format!(
                        "--nats-tls-client-key-path (NATS_TLS_CLIENT_KEY_PATH) {}: {e}",
                        key.display()
                    ))
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| Error::Config(format!("{flag}: {e}")))
            }
        }
    }
}

/// The verifier of `--nats-tls-insecure`: any certificate is accepted, but the handshake's
/// signatures are still checked, so the session is encrypted to whoever holds the key.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
