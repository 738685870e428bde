"""Evidence a deployment can trust: evaluation reports signed with its Ed25519 key, and the shipped ones pinned.

The mode gate (search.ranking.mode_gate) turns the semantic leg on by default from evaluation reports. A report is a
JSON file anyone with write access to its folder could edit -- one digit of an nDCG turns hybrid on. So a report
counts only when it is

* **pinned**: its file's SHA-256 is one the package ships (`search.ranking.mode_gate.PINNED_REPORTS`: the reports
  committed with this version), or
* **signed**: it carries `signature` = {algorithm "ed25519", key_id, value} over its canonical JSON (every field
  but `signature`, keys sorted, no spaces), and the key is one the deployment trusts
  (`retrieval.mode_gate.trusted_key_files`).

What is signed is the whole report: its binding, every mode's relevance, and the latency, memory and index size it
measured. `ki keys` makes a pair; `ki eval` and `ki eval --self` sign with `retrieval.mode_gate.signing_key_file`.
No private key lives in the repository.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ki.errors import PermanentError

ALGORITHM = "ed25519"
SIGNATURE_FIELD = "signature"


class EvidenceKeyError(PermanentError):
    """A key file that is missing, unreadable or not an Ed25519 key; the message names the file."""


def canonical(report: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the report without its signature, keys sorted, compact, UTF-8."""
    body = {k: v for k, v in report.items() if k != SIGNATURE_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def make_keys(folder: Path, name: str = "ki-evidence") -> tuple[Path, Path]:
    """A new pair in `folder`: `<name>.key` (private, PEM, readable by its owner only) and `<name>.pub`."""
    folder.mkdir(parents=True, exist_ok=True)
    private_path, public_path = folder / f"{name}.key", folder / f"{name}.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise EvidenceKeyError(f"{path}: exists already; not overwritten (move it away to make a new pair)")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public_path.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private_path, public_path


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise EvidenceKeyError(f"{path}: cannot read the key: {exc.strerror or type(exc).__name__}") from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(_read(path), password=None)
    except ValueError as exc:
        raise EvidenceKeyError(f"{path}: not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise EvidenceKeyError(f"{path}: not an Ed25519 key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(_read(path))
    except ValueError as exc:
        raise EvidenceKeyError(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise EvidenceKeyError(f"{path}: not an Ed25519 key")
    return key


def sign(report: Mapping[str, Any], private: Ed25519PrivateKey) -> dict[str, Any]:
    """`report` with its signature (any earlier one replaced)."""
    value = base64.b64encode(private.sign(canonical(report))).decode("ascii")
    signature = {"algorithm": ALGORITHM, "key_id": key_id(private.public_key()), "value": value}
    return {**{k: v for k, v in report.items() if k != SIGNATURE_FIELD}, SIGNATURE_FIELD: signature}


def signed_with(record: Mapping[str, Any], key_file: str | None, default: Any = None) -> dict[str, Any]:
    """`record` as its JSON will read (`default` for values JSON lacks), signed with the private key in
    `key_file` when there is one (`retrieval.mode_gate.signing_key_file`)."""
    as_written: dict[str, Any] = json.loads(json.dumps(record, default=default))
    return sign(as_written, load_private_key(key_file)) if key_file else as_written


def unverified_reason(report: Mapping[str, Any], trusted: Sequence[Ed25519PublicKey]) -> str | None:
    """None when a trusted key signed exactly this report; else why it does not count."""
    signature = report.get(SIGNATURE_FIELD)
    if not isinstance(signature, dict):
        return "not signed"
    if signature.get("algorithm") != ALGORITHM:
        return f"signed with {signature.get('algorithm')!r}, not {ALGORITHM}"
    keys = {key_id(k): k for k in trusted}
    key = keys.get(str(signature.get("key_id")))
    if key is None:
        return f"signed by key {signature.get('key_id')}, which this deployment does not trust"
    try:
        key.verify(base64.b64decode(str(signature.get("value")), validate=True), canonical(report))
    except (InvalidSignature, ValueError):
        return f"its signature (key {signature.get('key_id')}) does not verify: edited after it was signed"
    return None
