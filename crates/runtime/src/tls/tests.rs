use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tls")
        .join(name)
}

fn files(client_ca: bool) -> EdgeTlsFiles {
    EdgeTlsFiles {
        cert: data("server.pem"),
        key: data("server.key"),
        client_ca: client_ca.then(|| data("ca.pem")),
    }
}

fn connector(client_cert: bool) -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(data("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = if client_cert {
        let chain = CertificateDer::pem_file_iter(data("server.pem"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(data("server.key")).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Connects, sends `ping`, and returns what the server echoed.
async fn echo(address: std::net::SocketAddr, client_cert: bool) -> std::io::Result<Vec<u8>> {
    let tcp = tokio::net::TcpStream::connect(address).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut stream = connector(client_cert).connect(name, tcp).await?;
    stream.write_all(b"ping").await?;
    let mut reply = vec![0; 4];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut reply))
        .await
        .map_err(|_| std::io::Error::other("no reply"))??;
    Ok(reply)
}

/// A TLS echo server for `protocol`; its connections report their ALPN on the channel.
async fn serve(
    tls: Arc<EdgeTls>,
    protocol: EdgeProtocol,
) -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<Option<Vec<u8>>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut conns = incoming(listener, tls, protocol);
    let (alpn_tx, alpn_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(mut conn) = conns.recv().await {
            let _ = alpn_tx.send(conn.alpn_protocol().map(<[u8]>::to_vec));
            tokio::spawn(async move {
                let mut buf = [0; 4];
                if conn.read_exact(&mut buf).await.is_ok() {
                    let _ = conn.write_all(&buf).await;
                }
            });
        }
    });
    (address, alpn_rx)
}

#[test]
fn bad_files_are_refused_naming_the_flag() {
    assert!(EdgeTls::check(&files(false)).is_ok());
    assert!(EdgeTls::check(&files(true)).is_ok());
    let mismatch = EdgeTls::check(&EdgeTlsFiles {
        key: data("other.key"),
        ..files(false)
    })
    .unwrap_err();
    assert!(mismatch.contains("--tls-key-path"), "{mismatch}");
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\n").unwrap();
    let error = EdgeTls::check(&EdgeTlsFiles {
        cert: garbage.clone(),
        ..files(false)
    })
    .unwrap_err();
    assert!(error.contains("--tls-cert-path"), "{error}");
    let error = EdgeTls::check(&EdgeTlsFiles {
        key: garbage.clone(),
        ..files(false)
    })
    .unwrap_err();
    assert!(error.contains("--tls-key-path"), "{error}");
    let error = EdgeTls::check(&EdgeTlsFiles {
        client_ca: Some(garbage),
        ..files(false)
    })
    .unwrap_err();
    assert!(error.contains("--tls-client-ca-cert-path"), "{error}");
}

#[tokio::test]
async fn handshakes_negotiate_alpn_and_a_bad_reload_keeps_the_old_pair() {
    let (tls, _) = EdgeTls::open(files(false)).unwrap();
    let (http, mut http_alpn) = serve(tls.clone(), EdgeProtocol::Http).await;
    let (grpc, mut grpc_alpn) = serve(tls.clone(), EdgeProtocol::Grpc).await;
    assert_eq!(echo(http, false).await.unwrap(), b"ping");
    assert_eq!(http_alpn.recv().await.unwrap().as_deref(), Some(&b"h2"[..]));
    assert_eq!(echo(grpc, false).await.unwrap(), b"ping");
    assert_eq!(grpc_alpn.recv().await.unwrap().as_deref(), Some(&b"h2"[..]));

    let key = std::fs::read(data("server.key")).unwrap();
    let other = std::fs::read(data("other.key")).unwrap();
    let cert = std::fs::read(data("server.pem")).unwrap();
    assert!(tls.apply(&[cert.clone(), other]).is_err());
    assert!(tls.apply(&[b"nonsense".to_vec(), key.clone()]).is_err());
    assert_eq!(echo(http, false).await.unwrap(), b"ping");
    assert!(tls.apply(&[cert, key]).is_ok());
    assert_eq!(echo(http, false).await.unwrap(), b"ping");
}

#[tokio::test]
async fn a_client_ca_requires_a_client_certificate() {
    let (tls, _) = EdgeTls::open(files(true)).unwrap();
    let (address, mut accepted) = serve(tls, EdgeProtocol::Http).await;
    assert!(echo(address, false).await.is_err());
    assert_eq!(echo(address, true).await.unwrap(), b"ping");
    assert!(accepted.recv().await.is_some());
    assert!(accepted.try_recv().is_err(), "the anonymous client got in");
}
