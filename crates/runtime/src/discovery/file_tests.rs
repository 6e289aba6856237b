//! Unit tests of the file backend.

use super::*;

#[test]
fn keys_map_to_paths_under_the_root() {
    let root = Path::new("/tmp/r");
    assert_eq!(
        key_path(root, "/kvmesh/ns/models/Qwen%2FQwen3-0.6B/ff").unwrap(),
        Path::new("/tmp/r/kvmesh/ns/models/Qwen%2FQwen3-0.6B/ff")
    );
    for bad in [
        "",
        "kvmesh/a",
        "/kvmesh//a",
        "/kvmesh/../x",
        "/kvmesh/./x",
        "/a/",
        "/.kvmesh-tmp/x",
    ] {
        assert!(key_path(root, bad).is_err(), "{bad}");
    }
}
