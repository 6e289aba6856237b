"""Keys and subjects, spelled as the mesh spells them (docs/discovery.md, docs/kv-events.md)."""
import string

KEY_ROOT = "/kvmesh/"
SUBJECT_ROOT = "kvmesh"
_UNRESERVED = set((string.ascii_letters + string.digits + "-._~").encode())
_SUBJECT_SAFE = set((string.ascii_letters + string.digits + "-_").encode())


def encode_model_segment(name: str) -> str:
    """A served model name as one key segment: RFC 3986 unreserved bytes stay, others are %XX."""
    if name == ".":
        return "%2E"
    if name == "..":
        return "%2E%2E"
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in name.encode())


def subject_token(text: str) -> str:
    """A namespace or model name as one NATS subject token: bytes outside [A-Za-z0-9_-] are ~XX."""
    return "".join(chr(b) if b in _SUBJECT_SAFE else f"~{b:02X}" for b in text.encode())


def instance_key(namespace: str, component: str, endpoint: str, instance_id: int) -> str:
    return f"{KEY_ROOT}{namespace}/instances/{component}/{endpoint}/{instance_id:x}"


def model_key(namespace: str, model: str, instance_id: int) -> str:
    return f"{KEY_ROOT}{namespace}/models/{encode_model_segment(model)}/{instance_id:x}"


def load_subject(namespace: str, model: str) -> str:
    return f"{SUBJECT_ROOT}.{subject_token(namespace)}.load.{subject_token(model)}"
