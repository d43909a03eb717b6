"""Helpers for the logits tests: the tiny fixture checkpoints and their reference logits.

The checkpoints are not committed: build_fixtures() regenerates them with
tools/make_fixtures.py (numpy only, deterministic) and verifies them byte for byte against
tests/fixtures/ref/SHA256SUMS, the files the committed reference logits were computed from.

    from fixtures_util import build_fixtures, load_ref, compare_logits, CHECKPOINTS
    root = build_fixtures(tmp_path_factory.mktemp("fixtures"))
    # root/tiny-hf, root/tiny-mlx4, root/tiny-mlx8, root/tokens.json
    m = compare_logits(wren_logits, load_ref("tiny-mlx4"), rel_l2_max=1e-3, top1_min=0.995)
    assert m["ok"], m
"""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

SRC = os.environ.get("WREN_SRC") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REF_DIR = os.path.join(SRC, "tests", "fixtures", "ref")
CHECKPOINTS = ("tiny-hf", "tiny-mlx4", "tiny-mlx8")

_built = {}  # one generation per session (per process)


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_fixtures(root):
    """Raises AssertionError unless root holds exactly the files of SHA256SUMS, byte-identical."""
    expected = {}
    with open(os.path.join(REF_DIR, "SHA256SUMS")) as f:
        for line in f:
            digest, name = line.rstrip("\n").split("  ", 1)
            expected[name] = digest
    found = set()
    for dirpath, _, files in os.walk(root):
        for fname in files:
            found.add(os.path.relpath(os.path.join(dirpath, fname), root))
    if found != set(expected):
        raise AssertionError(f"fixture files differ from SHA256SUMS: missing {sorted(set(expected) - found)}, "
                             f"extra {sorted(found - set(expected))}")
    bad = [n for n, d in sorted(expected.items()) if _sha256(os.path.join(root, n)) != d]
    if bad:
        raise AssertionError(f"regenerated fixtures are not byte-identical to the reference ones: {bad} "
                             "(tools/make_fixtures.py or numpy changed; see tests/fixtures/README.md)")


def build_fixtures(tmpdir):
    """Generates the fixtures under tmpdir/fixtures (once per session), verifies them, returns
    the directory (holding tiny-hf, tiny-mlx4, tiny-mlx8 and tokens.json)."""
    if "root" in _built:
        return _built["root"]
    root = os.path.join(str(tmpdir), "fixtures")
    subprocess.run([sys.executable, os.path.join(SRC, "tools", "make_fixtures.py"), root], check=True)
    verify_fixtures(root)
    with open(os.path.join(root, "tokens.json")) as f, open(os.path.join(REF_DIR, "tokens.json")) as g:
        if json.load(f) != json.load(g):
            raise AssertionError("generated tokens.json differs from tests/fixtures/ref/tokens.json")
    _built["root"] = root
    return root


@pytest.fixture(scope="session")
def fixtures_dir(tmp_path_factory):
    """pytest fixture: import it into a test module to get the built fixture directory."""
    return build_fixtures(tmp_path_factory.mktemp("wren-fixtures"))


def load_tokens():
    with open(os.path.join(REF_DIR, "tokens.json")) as f:
        return json.load(f)


def tokens_file():
    """Path of the committed token ids (a JSON array of ints), for `wren logits --tokens-file`."""
    return os.path.join(REF_DIR, "tokens.json")


def load_ref(name):
    """Reference logits of checkpoint `name`: float32 array [n_tokens, vocab]."""
    n = len(load_tokens())
    data = np.fromfile(os.path.join(REF_DIR, name + ".f32"), dtype="<f4")
    if data.size % n:
        raise ValueError(f"{name}.f32: {data.size} values is not a multiple of {n} tokens")
    return data.reshape(n, data.size // n)


def load_logits(path, n_tokens, vocab):
    """A [n_tokens][vocab] float32 little-endian file, as `wren logits --out` writes it."""
    data = np.fromfile(path, dtype="<f4")
    if data.size != n_tokens * vocab:
        raise AssertionError(f"{path}: {data.size} floats, expected {n_tokens} x {vocab}")
    return data.reshape(n_tokens, vocab)


def compare_logits(wren_logits, ref, rel_l2_max=1e-3, top1_min=0.995):
    """Metrics of wren_logits against ref (both [T, vocab]; wren_logits may be a file path).

    rel_l2: ||wren - ref|| / ||ref|| over all positions; top1: fraction of positions with the same
    argmax; worst_pos / worst_pos_rel_l2: the position with the largest per-position relative error
    (to locate a bug); ok: both thresholds met and everything finite."""
    ref = np.asarray(ref, dtype=np.float64)
    if isinstance(wren_logits, (str, os.PathLike)):
        wren_logits = load_logits(wren_logits, *ref.shape)
    got = np.asarray(wren_logits, dtype=np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"logits shape {got.shape}, expected {ref.shape}")
    finite = bool(np.isfinite(got).all())
    diff = np.where(np.isfinite(got), got - ref, np.inf)
    rel_l2 = float(np.linalg.norm(diff) / np.linalg.norm(ref)) if finite else float("inf")
    per_pos = np.linalg.norm(diff, axis=1) / np.linalg.norm(ref, axis=1)
    top1 = float(np.mean(got.argmax(axis=1) == ref.argmax(axis=1)))
    worst = int(np.argmax(per_pos))
    return {
        "rel_l2": rel_l2,
        "top1": top1,
        "max_abs": float(np.max(np.abs(diff))),
        "worst_pos": worst,
        "worst_pos_rel_l2": float(per_pos[worst]),
        "ok": finite and rel_l2 <= rel_l2_max and top1 >= top1_min,
    }
