use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tls")
        .join(name)
}

fn pair(cert: &str, key: &str) -> Option<(PathBuf, PathBuf)> {
    Some((data(cert), data(key)))
}

/// The files of a mesh member: serves with `server.pem`, demands client certificates from
/// `ca.pem`, verifies servers with `ca.pem`, presents `server.pem` as its client certificate.
fn member() -> MeshTlsFiles {
    MeshTlsFiles {
        server: pair("server.pem", "server.key"),
        client_ca: Some(data("ca.pem")),
        ca: Some(data("ca.pem")),
        client: pair("server.pem", "server.key"),
    }
}

#[test]
fn files_are_checked_naming_the_flag() {
    assert!(MeshTls::open(member()).is_ok());
    let mismatch = MeshTls::open(MeshTlsFiles {
        server: pair("server.pem", "other.key"),
        ..member()
    })
    .unwrap_err();
    assert!(mismatch.contains("--tcp-tls-key-path"), "{mismatch}");
    let not_a_ca = MeshTls::open(MeshTlsFiles {
        ca: Some(data("server.key")),
        ..member()
    })
    .unwrap_err();
    assert!(not_a_ca.contains("--tcp-tls-ca-cert-path"), "{not_a_ca}");
    let client = MeshTls::open(MeshTlsFiles {
        client: pair("server.pem", "other.key"),
        ..member()
    })
    .unwrap_err();
    assert!(client.contains("--tcp-tls-client-cert-path"), "{client}");
    let (tls, _) = MeshTls::open(MeshTlsFiles {
        server: pair("server.pem", "server.key"),
        ..Default::default()
    })
    .unwrap();
    assert!(tls.server_config().is_some() && tls.client_config().is_none());
    assert!(!tls.dials_tls());
}

/// A TLS server with `tls`'s server configuration that answers each connection with `ok` once
/// its handshake is done.
async fn serve(tls: Arc<MeshTls>) -> std::net::SocketAddr {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut conns = crate::tls::incoming_with(listener, move || tls.server_config());
    tokio::spawn(async move {
        while let Some(mut conn) = conns.recv().await {
            let _ = conn.write_all(b"ok").await;
            let _ = conn.flush().await;
        }
    });
    address
}

/// Dials `address` with `client`'s connector and reads the server's greeting.
async fn dial(address: std::net::SocketAddr, client: Arc<MeshTls>) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    use tower::Service;
    let uri: http::Uri = format!("http://{address}").parse().unwrap();
    let io = MeshConnector::new(client).call(uri).await?;
    let mut stream = io.into_inner();
    let mut reply = vec![0; 2];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut reply))
        .await
        .map_err(|_| std::io::Error::other("no reply"))??;
    Ok(reply)
}

#[tokio::test]
async fn only_a_certificate_of_the_mesh_ca_gets_in() {
    let (server, _) = MeshTls::open(member()).unwrap();
    let address = serve(server).await;
    let (mesh_client, _) = MeshTls::open(MeshTlsFiles {
        server: None,
        client_ca: None,
        ..member()
    })
    .unwrap();
    assert_eq!(dial(address, mesh_client).await.unwrap(), b"ok");
    let (outsider, _) = MeshTls::open(MeshTlsFiles {
        ca: Some(data("ca.pem")),
        client: pair("other-client.pem", "other-client.key"),
        ..Default::default()
    })
    .unwrap();
    assert!(dial(address, outsider).await.is_err());
    let (anonymous, _) = MeshTls::open(MeshTlsFiles {
        ca: Some(data("ca.pem")),
        ..Default::default()
    })
    .unwrap();
    assert!(dial(address, anonymous).await.is_err());
    // A client that trusts another CA refuses the mesh's server.
    let (wrong_trust, _) = MeshTls::open(MeshTlsFiles {
        ca: Some(data("other-ca.pem")),
        client: pair("server.pem", "server.key"),
        ..Default::default()
    })
    .unwrap();
    assert!(dial(address, wrong_trust).await.is_err());
}

#[tokio::test]
async fn a_reloaded_client_ca_takes_effect_and_a_bad_one_is_refused() {
    let (server, _) = MeshTls::open(member()).unwrap();
    let address = serve(server.clone()).await;
    let (outsider, _) = MeshTls::open(MeshTlsFiles {
        ca: Some(data("ca.pem")),
        client: pair("other-client.pem", "other-client.key"),
        ..Default::default()
    })
    .unwrap();
    assert!(dial(address, outsider.clone()).await.is_err());
    let read = |name: &str| std::fs::read(data(name)).unwrap();
    // Contents in flag order: server cert, key, client CA, CA, client cert, key.
    let trusting_the_outsider = [
        read("server.pem"),
        read("server.key"),
        read("other-ca.pem"),
        read("ca.pem"),
        read("server.pem"),
        read("server.key"),
    ];
    assert!(
        server
            .apply(&[b"junk".to_vec(), read("server.key")])
            .is_err()
    );
    let mut broken = trusting_the_outsider.clone();
    broken[1] = read("other.key");
    assert!(server.apply(&broken).is_err());
    assert!(dial(address, outsider.clone()).await.is_err());
    server.apply(&trusting_the_outsider).unwrap();
    assert_eq!(dial(address, outsider).await.unwrap(), b"ok");
}
