"""A throwaway certificate authority for the TLS tests, made with the `openssl` command line: a CA
and leaf certificates for 127.0.0.1 / localhost, usable by servers and clients (mutual TLS)."""
import subprocess
from pathlib import Path

CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, text=True)


class Ca:
    """A CA in `directory`: `pem` is its certificate, the file clients trust."""

    def __init__(self, directory, name="kvmesh test CA"):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        slug = name.replace(" ", "-")
        self.pem = self.dir / f"{slug}.pem"
        self.key = self.dir / f"{slug}.key"
        _openssl("req", "-x509", *CURVE, "-keyout", str(self.key), "-out", str(self.pem), "-days", "2",
                 "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def issue(self, common_name, serial):
        """A leaf for 127.0.0.1 and localhost with `common_name` and `serial`: (cert, key) paths."""
        cert = self.dir / f"{common_name}.pem"
        key = self.dir / f"{common_name}.key"
        csr = self.dir / f"{common_name}.csr"
        ext = self.dir / f"{common_name}.ext"
        ext.write_text("basicConstraints=critical,CA:FALSE\n"
                       "keyUsage=critical,digitalSignature\n"
                       "extendedKeyUsage=serverAuth,clientAuth\n"
                       "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl("req", *CURVE, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={common_name}")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.pem), "-CAkey", str(self.key),
                 "-set_serial", str(serial), "-days", "2", "-out", str(cert), "-extfile", str(ext))
        return cert, key
