//! TLS options of Dynamo's command line: the HTTP edge's certificate and client CA, the internal
//! gRPC (TCP request plane) certificates, and the NATS client's. Every path must name a file and
//! the certificate/key options come in pairs ([`TlsOpts::check`]).
//!
//! The edge's (`--tls-*`) are served: the frontend's HTTP and KServe gRPC servers speak TLS with
//! them ([`crate::tls`]); processes without an edge do not read them. The internal gRPC and NATS
//! ones are not implemented yet, so a process given any of them refuses to start rather than
//! dial or serve plaintext where TLS was asked for.

use std::path::PathBuf;

use clap::Args;
use kvmesh_core::flags::parse_bool;

/// The TLS flags (see the module docs).
#[derive(Debug, Clone, Default, Args)]
pub struct TlsOpts {
    /// PEM certificate chain of the frontend's HTTP and KServe gRPC edge (HTTPS), re-read when
    /// the file changes.
    #[arg(long, env = "DYN_TLS_CERT_PATH", value_parser = existing_file)]
    pub tls_cert_path: Option<PathBuf>,
    /// PEM private key of `--tls-cert-path`.
    #[arg(long, env = "DYN_TLS_KEY_PATH", value_parser = existing_file)]
    pub tls_key_path: Option<PathBuf>,
    /// PEM CA that client certificates of the edge must chain to (mutual TLS: a client without
    /// one is refused).
    #[arg(long, env = "DYN_TLS_CLIENT_CA_CERT_PATH", value_parser = existing_file)]
    pub tls_client_ca_cert_path: Option<PathBuf>,
    /// PEM certificate of this process's internal gRPC server.
    #[arg(long, env = "DYN_TCP_TLS_CERT_PATH", value_parser = existing_file)]
    pub tcp_tls_cert_path: Option<PathBuf>,
    /// PEM private key of `--tcp-tls-cert-path`.
    #[arg(long, env = "DYN_TCP_TLS_KEY_PATH", value_parser = existing_file)]
    pub tcp_tls_key_path: Option<PathBuf>,
    /// PEM CA that verifies the internal gRPC peers' certificates.
    #[arg(long, env = "DYN_TCP_TLS_CA_CERT_PATH", value_parser = existing_file)]
    pub tcp_tls_ca_cert_path: Option<PathBuf>,
    /// PEM client certificate presented to internal gRPC servers (mutual TLS).
    #[arg(long, env = "DYN_TCP_TLS_CLIENT_CERT_PATH", value_parser = existing_file)]
    pub tcp_tls_client_cert_path: Option<PathBuf>,
    /// PEM private key of `--tcp-tls-client-cert-path`.
    #[arg(long, env = "DYN_TCP_TLS_CLIENT_KEY_PATH", value_parser = existing_file)]
    pub tcp_tls_client_key_path: Option<PathBuf>,
    /// PEM CA the internal gRPC server verifies client certificates with (mTLS enforced).
    #[arg(long, env = "DYN_TCP_TLS_CLIENT_CA_CERT_PATH", value_parser = existing_file)]
    pub tcp_tls_client_ca_cert_path: Option<PathBuf>,
    /// PEM CA that verifies the NATS server.
    #[arg(long, env = "NATS_TLS_CA_CERT_PATH", value_parser = existing_file)]
    pub nats_tls_ca_cert_path: Option<PathBuf>,
    /// PEM client certificate presented to NATS (mutual TLS).
    #[arg(long, env = "NATS_TLS_CLIENT_CERT_PATH", value_parser = existing_file)]
    pub nats_tls_client_cert_path: Option<PathBuf>,
    /// PEM private key of `--nats-tls-client-cert-path`.
    #[arg(long, env = "NATS_TLS_CLIENT_KEY_PATH", value_parser = existing_file)]
    pub nats_tls_client_key_path: Option<PathBuf>,
    /// Skip verifying the NATS server's certificate (development only).
    #[arg(long, env = "NATS_TLS_INSECURE", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub nats_tls_insecure: bool,
    /// Turn --nats-tls-insecure off.
    #[arg(long, overrides_with = "nats_tls_insecure")]
    pub no_nats_tls_insecure: bool,
}

impl TlsOpts {
    /// The edge's certificate files, when `--tls-cert-path` and `--tls-key-path` are given.
    pub fn edge_files(&self) -> Option<crate::tls::EdgeTlsFiles> {
        Some(crate::tls::EdgeTlsFiles {
            cert: self.tls_cert_path.clone()?,
            key: self.tls_key_path.clone()?,
            client_ca: self.tls_client_ca_cert_path.clone(),
        })
    }

    /// Checks the pairs and that the edge's files make a valid TLS configuration, then refuses
    /// the internal gRPC and NATS options, which this release does not implement: a deployment
    /// that asked for TLS there must not silently get plaintext.
    pub fn check(&self) -> Result<(), String> {
        let pairs = [
            (
                "--tls-cert-path (DYN_TLS_CERT_PATH)",
                "--tls-key-path (DYN_TLS_KEY_PATH)",
                &self.tls_cert_path,
                &self.tls_key_path,
            ),
            (
                "--tcp-tls-cert-path (DYN_TCP_TLS_CERT_PATH)",
                "--tcp-tls-key-path (DYN_TCP_TLS_KEY_PATH)",
                &self.tcp_tls_cert_path,
                &self.tcp_tls_key_path,
            ),
            (
                "--tcp-tls-client-cert-path (DYN_TCP_TLS_CLIENT_CERT_PATH)",
                "--tcp-tls-client-key-path (DYN_TCP_TLS_CLIENT_KEY_PATH)",
                &self.tcp_tls_client_cert_path,
                &self.tcp_tls_client_key_path,
            ),
            (
                "--nats-tls-client-cert-path (NATS_TLS_CLIENT_CERT_PATH)",
                "--nats-tls-client-key-path (NATS_TLS_CLIENT_KEY_PATH)",
                &self.nats_tls_client_cert_path,
                &self.nats_tls_client_key_path,
            ),
        ];
        for (cert, key, cert_path, key_path) in pairs {
            match (cert_path.is_some(), key_path.is_some()) {
                (true, false) => return Err(format!("{cert}: needs {key}")),
                (false, true) => return Err(format!("{key}: needs {cert}")),
                _ => {}
            }
        }
        if self.tls_client_ca_cert_path.is_some() && self.tls_cert_path.is_none() {
            return Err(
                "--tls-client-ca-cert-path (DYN_TLS_CLIENT_CA_CERT_PATH): needs --tls-cert-path and --tls-key-path".into(),
            );
        }
        let set = self.unsupported_flags();
        if !set.is_empty() {
            return Err(format!(
                "{}: TLS of the internal gRPC and of NATS is not supported in this release; kvmesh dials and serves them in plaintext only, so it refuses to start rather than ignore a TLS setting",
                set.join(", ")
            ));
        }
        match self.edge_files() {
            Some(files) => crate::tls::EdgeTls::check(&files),
            None => Ok(()),
        }
    }

    /// The internal gRPC and NATS TLS flags that are set, in declaration order.
    fn unsupported_flags(&self) -> Vec<&'static str> {
        [
            (
                "--tcp-tls-cert-path (DYN_TCP_TLS_CERT_PATH)",
                self.tcp_tls_cert_path.is_some(),
            ),
            (
                "--tcp-tls-key-path (DYN_TCP_TLS_KEY_PATH)",
                self.tcp_tls_key_path.is_some(),
            ),
            (
                "--tcp-tls-ca-cert-path (DYN_TCP_TLS_CA_CERT_PATH)",
                self.tcp_tls_ca_cert_path.is_some(),
            ),
            (
                "--tcp-tls-client-cert-path (DYN_TCP_TLS_CLIENT_CERT_PATH)",
                self.tcp_tls_client_cert_path.is_some(),
            ),
            (
                "--tcp-tls-client-key-path (DYN_TCP_TLS_CLIENT_KEY_PATH)",
                self.tcp_tls_client_key_path.is_some(),
            ),
            (
                "--tcp-tls-client-ca-cert-path (DYN_TCP_TLS_CLIENT_CA_CERT_PATH)",
                self.tcp_tls_client_ca_cert_path.is_some(),
            ),
            (
                "--nats-tls-ca-cert-path (NATS_TLS_CA_CERT_PATH)",
                self.nats_tls_ca_cert_path.is_some(),
            ),
            (
                "--nats-tls-client-cert-path (NATS_TLS_CLIENT_CERT_PATH)",
                self.nats_tls_client_cert_path.is_some(),
            ),
            (
                "--nats-tls-client-key-path (NATS_TLS_CLIENT_KEY_PATH)",
                self.nats_tls_client_key_path.is_some(),
            ),
            (
                "--nats-tls-insecure (NATS_TLS_INSECURE)",
                self.nats_tls_insecure && !self.no_nats_tls_insecure,
            ),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect()
    }
}

fn existing_file(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("file {value:?} does not exist"))
    }
}
