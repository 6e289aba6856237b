"""NKeys, JWTs and credentials files for nats-server's NKey and operator (JWT) authentication,
made in Python for the tests (no `nsc` here): keys come from the `nkeys` package (ed25519 seeds
and public keys in NATS's base32 form); JWTs follow NATS's v2 claims, signed by the issuer's
NKey; a credentials file is a user JWT and its seed in the decorated format clients read."""
import base64
import hashlib
import json
import os
import time

import nkeys

PREFIXES = {"operator": nkeys.PREFIX_BYTE_OPERATOR, "account": nkeys.PREFIX_BYTE_ACCOUNT,
            "user": nkeys.PREFIX_BYTE_USER}


class NKey:
    """A fresh NKey of `kind` (operator, account or user): `seed` (S...) and `public` (O..., A...,
    U...)."""

    def __init__(self, kind):
        self.seed = nkeys.encode_seed(os.urandom(32), PREFIXES[kind]).decode()
        self.pair = nkeys.from_seed(self.seed.encode())
        self.public = self.pair.public_key.decode()
        assert self.public[0] == kind[0].upper() and self.seed.startswith("S" + self.public[0])

    def sign(self, data):
        return self.pair.sign(data)


def _b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(issuer, subject, name, nats):
    """A JWT of `nats` claims about `subject` (a public key) signed by `issuer` (an NKey). As NATS
    writes them: `jti` is the base32 (unpadded) SHA-512/256 of the standard claims without it."""
    claims = {"iat": int(time.time()), "iss": issuer.public, "name": name, "sub": subject}
    digest = hashlib.new("sha512_256", json.dumps(claims, separators=(",", ":")).encode()).digest()
    claims = {"jti": base64.b32encode(digest).decode().rstrip("="), **claims, "nats": {**nats, "version": 2}}
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    return f"{header}.{body}.{_b64(issuer.sign(f'{header}.{body}'.encode()))}"


UNLIMITED = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
             "conn": -1, "leaf": -1}


def account_jwt(operator, account, name, jetstream):
    limits = dict(UNLIMITED)
    if jetstream:  # JetStream is on for an account whose storage limits are not 0
        limits.update({"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1})
    return jwt(operator, account.public, name, {"type": "account", "limits": limits})


def user_jwt(account, user, name):
    return jwt(account, user.public, name,
               {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1})


def creds(user_token, seed):
    """A credentials file's text: the user JWT and the user's seed, each between its markers."""
    return (f"-----BEGIN NATS USER JWT-----\n{user_token}\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n"
            "*************************************************************\n")


class Operator:
    """An operator with a system account (JetStream needs one) and one JetStream-enabled account,
    for a nats-server with `resolver: MEMORY`: `config()` is the server's configuration, `user()`
    a new user of the account."""

    def __init__(self):
        self.key, self.system, self.account = NKey("operator"), NKey("account"), NKey("account")
        self.token = jwt(self.key, self.key.public, "kvmesh-test", {"type": "operator"})
        self.accounts = {self.system.public: account_jwt(self.key, self.system, "SYS", jetstream=False),
                         self.account.public: account_jwt(self.key, self.account, "kvmesh", jetstream=True)}

    def config(self):
        preload = "\n".join(f"  {key}: {token}" for key, token in self.accounts.items())
        return (f"operator: {self.token}\nsystem_account: {self.system.public}\nresolver: MEMORY\n"
                f"resolver_preload: {{\n{preload}\n}}\n")

    def user(self, name="kvmesh"):
        """A new user of the account: (its NKey, its JWT)."""
        user = NKey("user")
        return user, user_jwt(self.account, user, name)
