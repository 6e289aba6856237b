"""The mesh's TLS and credential settings, read as the Rust services read them.

- The worker's gRPC server: `--tcp-tls-cert-path`/`--tcp-tls-key-path` (`DYN_TCP_TLS_*`) serve
  TLS; with `--tcp-tls-client-ca-cert-path` a client must present a certificate from that CA
  (mutual TLS). The files are read again when they change (checked at each handshake).
- etcd: `ETCD_AUTH_CA` (server CA), `ETCD_AUTH_CLIENT_CERT`/`ETCD_AUTH_CLIENT_KEY` (client
  certificate), `ETCD_AUTH_USERNAME`/`ETCD_AUTH_PASSWORD` (a token from etcd's auth API).
- NATS: `NATS_TLS_CA_CERT_PATH`, `NATS_TLS_CLIENT_CERT_PATH`/`NATS_TLS_CLIENT_KEY_PATH`,
  `NATS_TLS_INSECURE`, and one of `NATS_AUTH_USERNAME`/`NATS_AUTH_PASSWORD`, `NATS_AUTH_TOKEN`,
  `NATS_AUTH_NKEY`, `NATS_AUTH_CREDENTIALS_FILE` (or a user and password in the URL).

Secrets come from the environment only, never from flags (a command line is visible in `ps`).
"""
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value or None


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


@dataclass
class ServerTls:
    """The worker's gRPC server certificate, key and (for mutual TLS) client CA."""

    cert: str
    key: str
    client_ca: str | None

    def credentials(self) -> grpc.ServerCredentials:
        """Credentials that re-read the files when one of them changes (new handshakes only)."""
        paths = [p for p in (self.cert, self.key, self.client_ca) if p]
        seen = {"stamp": None}

        def load():
            return grpc.ssl_server_certificate_configuration(
                [(_read(self.key), _read(self.cert))], root_certificates=_read(self.client_ca))

        def fetch():
            stamp = tuple(os.stat(p).st_mtime_ns for p in paths)
            if stamp == seen["stamp"]:
                return None
            try:
                config = load()
            except OSError:
                return None  # keep the loaded pair while the files are being replaced
            seen["stamp"] = stamp
            return config

        initial = load()
        seen["stamp"] = tuple(os.stat(p).st_mtime_ns for p in paths)
        return grpc.dynamic_ssl_server_credentials(initial, fetch,
                                                   require_client_authentication=self.client_ca is not None)


def server_tls(options) -> ServerTls | None:
    if bool(options.tcp_tls_cert_path) != bool(options.tcp_tls_key_path):
        raise SystemExit("--tcp-tls-cert-path and --tcp-tls-key-path (DYN_TCP_TLS_CERT_PATH/KEY_PATH) go together")
    if options.tcp_tls_client_ca_cert_path and not options.tcp_tls_cert_path:
        raise SystemExit("--tcp-tls-client-ca-cert-path needs --tcp-tls-cert-path and --tcp-tls-key-path")
    if not options.tcp_tls_cert_path:
        return None
    return ServerTls(options.tcp_tls_cert_path, options.tcp_tls_key_path, options.tcp_tls_client_ca_cert_path)


def etcd_ssl() -> ssl.SSLContext | None:
    """The TLS context for etcd, or None for plain HTTP."""
    ca, cert, key = _env("ETCD_AUTH_CA"), _env("ETCD_AUTH_CLIENT_CERT"), _env("ETCD_AUTH_CLIENT_KEY")
    if not (ca or cert):
        return None
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def etcd_user() -> tuple[str, str] | None:
    user, password = _env("ETCD_AUTH_USERNAME"), _env("ETCD_AUTH_PASSWORD")
    if bool(user) != bool(password):
        raise SystemExit("ETCD_AUTH_USERNAME and ETCD_AUTH_PASSWORD go together")
    return (user, password) if user else None


def nats_options() -> dict:
    """Keyword arguments of `nats.connect` for the TLS and credentials of the environment."""
    options: dict = {}
    ca, cert, key = _env("NATS_TLS_CA_CERT_PATH"), _env("NATS_TLS_CLIENT_CERT_PATH"), _env("NATS_TLS_CLIENT_KEY_PATH")
    insecure = (_env("NATS_TLS_INSECURE") or "false").lower() in ("1", "true", "yes", "on")
    if ca or cert or insecure:
        context = ssl.create_default_context(cafile=ca)
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert:
            context.load_cert_chain(cert, key)
        options["tls"] = context
    user, password = _env("NATS_AUTH_USERNAME"), _env("NATS_AUTH_PASSWORD")
    if user or password:
        options["user"], options["password"] = user, password
    if _env("NATS_AUTH_TOKEN"):
        options["token"] = _env("NATS_AUTH_TOKEN")
    if _env("NATS_AUTH_NKEY"):
        options["nkeys_seed_str"] = _env("NATS_AUTH_NKEY")
    if _env("NATS_AUTH_CREDENTIALS_FILE"):
        options["user_credentials"] = _env("NATS_AUTH_CREDENTIALS_FILE")
    return options
