"""The HeadRoles loader: the roles file format of include/kvsift/gates/roles_file.hpp, parsed by
kvsift's C++ parser, on a file written here and on malformed ones (ValueError naming line and column)."""

from __future__ import annotations

import pytest
import torch

import kvsift
from kvsift import HeadRoles

GOOD = """# LycheeDecode head roles written by the test
kvsift-head-roles v1 layers=3 kv_heads=4

RRRR
SSRS \t\r
# a comment between rows
SRSS
"""


def test_load_file(tmp_path):
    path = tmp_path / "roles.txt"
    path.write_text(GOOD)
    roles = kvsift.load_head_roles(path)
    assert (roles.layers, roles.kv_heads) == (3, 4)
    assert roles.retrieval == ((True, True, True, True), (False, False, True, False), (False, True, False, False))
    assert roles.sparse_heads(1) == [0, 1, 3]
    assert roles.retrieval_heads(2) == [1]
    assert roles.is_retrieval(0, 3) and not roles.is_retrieval(2, 0)
    assert roles.retrieval_count() == 6
    t = roles.to_tensor()
    assert t.dtype == torch.bool and t.shape == (3, 4)
    assert HeadRoles.from_tensor(t) == roles
    assert HeadRoles.load(str(path), expected_layers=3, expected_kv_heads=4) == roles


def test_round_trip(tmp_path):
    roles = HeadRoles.from_tensor(torch.tensor([[True, False], [False, False]]))
    text = roles.format()
    assert text.splitlines()[-3:] == ["kvsift-head-roles v1 layers=2 kv_heads=2", "RS", "SS"]
    assert "1 of 4 heads are retrieval heads" in text
    path = tmp_path / "out.txt"
    roles.save(path)
    assert kvsift.load_head_roles(path) == roles


@pytest.mark.parametrize("text, message", [
    ("kvsift-head-roles v1 layers=2 kv_heads=3\nRSR\nSXR\n",
     r"invalid argument: roles file line 3, column 2: illegal character 'X' \(expected 'R' for retrieval or 'S' for sparse\)"),
    ("kvsift-head-roles v1 layers=2 kv_heads=3\nRSR\nSR\n", r"roles file line 3: row has 2 heads, expected kv_heads = 3"),
    ("kvsift-head-roles v1 layers=1 kv_heads=2\nRS\nSS\n", r"roles file line 3: more than layers = 1 rows"),
    ("kvsift-head-roles v1 layers=3 kv_heads=2\nRS\n", r"roles file has 1 layer rows, but its header says layers = 3"),
    ("# only a comment\n\n", r"roles file has no 'kvsift-head-roles' header line"),
    ("RRSS\n", r"roles file line 1: expected the header 'kvsift-head-roles v1 layers=<n> kv_heads=<n>', got 'RRSS'"),
    ("kvsift-head-roles v2 layers=1 kv_heads=1\nR\n", r"expected the header"),
    ("kvsift-head-roles v1 layers=1 kv_heads=1 extra\nR\n", r"expected the header"),
    ("kvsift-head-roles v1 layers=0 kv_heads=1\n", r"layers = 0 and kv_heads = 1 must be > 0"),
])
def test_malformed(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        HeadRoles.parse(text)
    path = tmp_path / "bad.txt"
    path.write_text(text)
    # From a file the message is prefixed with the path, as read_head_roles_file does.
    with pytest.raises(ValueError, match=r"bad\.txt: kvsift\.parse_head_roles: .*" + message):
        HeadRoles.load(path)


def test_other_model(tmp_path):
    with pytest.raises(ValueError, match=r"roles file has layers = 3 but the model has 32 layers"):
        HeadRoles.parse(GOOD, expected_layers=32)
    with pytest.raises(ValueError, match=r"roles file has kv_heads = 4 but the model has 8 KV heads per layer"):
        HeadRoles.parse(GOOD, expected_kv_heads=8)


def test_too_many_heads():
    with pytest.raises(NotImplementedError, match=r"kv_heads = 300 exceeds 256"):
        HeadRoles.parse("kvsift-head-roles v1 layers=1 kv_heads=300\n" + "R" * 300 + "\n")


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"path = '.*nope\.txt' cannot be opened for reading"):
        HeadRoles.load(tmp_path / "nope.txt")


def test_bad_tables():
    with pytest.raises(ValueError, match=r"retrieval must be 2 rows of 2 bools"):
        HeadRoles(2, 2, ((True, False),))
    with pytest.raises(ValueError, match=r"kvsift\.format_head_roles: .*kv_heads = 0 must be in \[1, 256\]"):
        torch.ops.kvsift.format_head_roles(torch.zeros(2, 0, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"retrieval\.dtype = Long must be one of Bool"):
        torch.ops.kvsift.format_head_roles(torch.zeros(2, 2, dtype=torch.long))
