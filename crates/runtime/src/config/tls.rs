//! TLS options: Dynamo's for the HTTP edge, the internal gRPC (TCP request plane) and the NATS
//! client, and kvmesh's flags for etcd's (Dynamo reads them from `ETCD_AUTH_*` only) and for a
//! NATS credentials file (`NATS_AUTH_CREDENTIALS_FILE`). Every path must name a file and the
//! certificate/key options come in pairs ([`TlsOpts::check`]).
//!
//! The edge's (`--tls-*`) serve the frontend's HTTP and KServe gRPC ([`crate::tls`]); the
//! internal gRPC's (`--tcp-tls-*`) every mesh server and client ([`crate::tls::mesh`]); the NATS
//! and etcd ones their clients ([`crate::connect`]). User names, passwords, tokens and NKey seeds
//! are read from the environment only ([`super::credentials`]).

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
    /// NATS credentials file (user JWT and NKey seed, as `nsc` writes it); a kvmesh flag for
    /// Dynamo's variable.
    #[arg(long, env = "NATS_AUTH_CREDENTIALS_FILE", value_parser = existing_file)]
    pub nats_auth_credentials_file: Option<PathBuf>,
    /// PEM CA that verifies the etcd servers (then `--etcd-endpoints` are dialed over TLS); a
    /// kvmesh flag for Dynamo's variable.
    #[arg(long, env = "ETCD_AUTH_CA", value_parser = existing_file)]
    pub etcd_tls_ca_cert_path: Option<PathBuf>,
    /// PEM client certificate presented to etcd (`--client-cert-auth`); a kvmesh flag for
    /// Dynamo's variable.
    #[arg(long, env = "ETCD_AUTH_CLIENT_CERT", value_parser = existing_file)]
    pub etcd_tls_client_cert_path: Option<PathBuf>,
    /// PEM private key of `--etcd-tls-client-cert-path`; a kvmesh flag for Dynamo's variable.
    #[arg(long, env = "ETCD_AUTH_CLIENT_KEY", value_parser = existing_file)]
    pub etcd_tls_client_key_path: Option<PathBuf>,
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

    /// The internal gRPC's certificate files ([`crate::tls::mesh`]).
    pub fn mesh_files(&self) -> crate::tls::mesh::MeshTlsFiles {
        crate::tls::mesh::MeshTlsFiles {
            server: self
                .tcp_tls_cert_path
                .clone()
                .zip(self.tcp_tls_key_path.clone()),
            client_ca: self.tcp_tls_client_ca_cert_path.clone(),
            ca: self.tcp_tls_ca_cert_path.clone(),
            client: self
                .tcp_tls_client_cert_path
                .clone()
                .zip(self.tcp_tls_client_key_path.clone()),
        }
    }

    /// Whether `--nats-tls-insecure` is on.
    pub fn nats_insecure(&self) -> bool {
        kvmesh_core::flags::negatable(self.nats_tls_insecure, self.no_nats_tls_insecure)
    }

    /// Checks the pairs, what each option needs beside it, and that the edge's and the internal
    /// gRPC's files make valid TLS configurations.
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
            (
                "--etcd-tls-client-cert-path (ETCD_AUTH_CLIENT_CERT)",
                "--etcd-tls-client-key-path (ETCD_AUTH_CLIENT_KEY)",
                &self.etcd_tls_client_cert_path,
                &self.etcd_tls_client_key_path,
            ),
        ];
        for (cert, key, cert_path, key_path) in pairs {
            match (cert_path.is_some(), key_path.is_some()) {
                (true, false) => return Err(format!("{cert}: needs {key}")),
                (false, true) => return Err(format!("{key}: needs {cert}")),
                _ => {}
            }
        }
        let needs = [
            (
                self.tls_client_ca_cert_path.is_some() && self.tls_cert_path.is_none(),
                "--tls-client-ca-cert-path (DYN_TLS_CLIENT_CA_CERT_PATH): needs --tls-cert-path and --tls-key-path",
            ),
            (
                self.tcp_tls_client_ca_cert_path.is_some() && self.tcp_tls_cert_path.is_none(),
                "--tcp-tls-client-ca-cert-path (DYN_TCP_TLS_CLIENT_CA_CERT_PATH): needs --tcp-tls-cert-path and --tcp-tls-key-path (a server that asks for client certificates speaks TLS)",
            ),
            (
                self.tcp_tls_client_cert_path.is_some() && self.tcp_tls_ca_cert_path.is_none(),
                "--tcp-tls-client-cert-path (DYN_TCP_TLS_CLIENT_CERT_PATH): needs --tcp-tls-ca-cert-path (the CA that verifies the servers it is presented to)",
            ),
            (
                self.etcd_tls_client_cert_path.is_some() && self.etcd_tls_ca_cert_path.is_none(),
                "--etcd-tls-client-cert-path (ETCD_AUTH_CLIENT_CERT): needs --etcd-tls-ca-cert-path (ETCD_AUTH_CA)",
            ),
        ];
        if let Some((_, message)) = needs.iter().find(|(is_missing, _)| *is_missing) {
            return Err((*message).to_string());
        }
        if let Some(files) = self.edge_files() {
            crate::tls::EdgeTls::check(&files)?;
        }
        let mesh = self.mesh_files();
        if !mesh.is_empty() {
            crate::tls::mesh::MeshTls::open(mesh)?;
        }
        Ok(())
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
