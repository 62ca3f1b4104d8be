"""Slurm's gres and TRES strings (slurm/gres.py): every form read, written, and read back."""

from __future__ import annotations

import pytest

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.slurm.gres import (
    Gres,
    gpu_index,
    gres_gpu_count,
    node_gpus,
    parse_gres,
    parse_gres_detail,
    parse_index_spec,
    placement_gres,
    requested_gres,
    typed_gres,
    typed_indices,
    write_gres,
)

TYPED = (Gres("gpu", "g0", 1), Gres("shard", "g2", 1))


@pytest.mark.parametrize(
    ("text", "items"),
    [
        ("gpu:g0:1,shard:g2:1", TYPED),  # a request, as the controller gives it
        ("gres:gpu:g0:1,gres:shard:g2:1", TYPED),  # tres_per_node as 22.05 prints it
        ("gres/gpu:g0:1,gres/shard:g2:1", TYPED),  # and 24.11
        ("gpu:2", (Gres("gpu", "", 2),)),  # untyped
        ("gres/gpu:tesla:2", (Gres("gpu", "tesla", 2),)),
        ("gpu:2(IDX:0-1)", (Gres("gpu", "", 2, "IDX:0-1"),)),  # gres_detail
        ("gpu:(null):3(IDX:0,2-3)", (Gres("gpu", "", 3, "IDX:0,2-3"),)),
        ("gpu:g1:0(IDX:N/A),shard:g2:1(1/2)", (Gres("gpu", "g1", 0, "IDX:N/A"), Gres("shard", "g2", 1, "1/2"))),
        ("gpu:4(S:0-1)", (Gres("gpu", "", 4, "S:0-1"),)),  # a node's configured gres
        ("cpu=4,mem=16G,node=1,billing=4,gres/gpu=2", (Gres("gpu", "", 2),)),  # TRES: only the gres/ items
        ("gres/gpu:a100=1", (Gres("gpu", "a100", 1),)),
        ("gpu", (Gres("gpu"),)),  # no count: 1
        ("", ()),
        ("(null)", ()),
    ],
)
def test_every_form_parses(text: str, items: tuple[Gres, ...]) -> None:
    assert parse_gres(text) == items


@pytest.mark.parametrize(
    ("items", "prefix", "tres", "text"),
    [
        (TYPED, "", False, "gpu:g0:1,shard:g2:1"),
        (TYPED, "gres/", False, "gres/gpu:g0:1,gres/shard:g2:1"),
        (TYPED, "gres:", False, "gres:gpu:g0:1,gres:shard:g2:1"),
        ((Gres("gpu", "", 2),), "", False, "gpu:2"),
        ((Gres("gpu", "", 2, "IDX:0-1"),), "", False, "gpu:2(IDX:0-1)"),
        ((Gres("gpu", "g1", 0, "IDX:N/A"), Gres("shard", "g2", 1, "1/2")), "", False,
         "gpu:g1:0(IDX:N/A),shard:g2:1(1/2)"),
        ((Gres("gpu", "", 2),), "", True, "gres/gpu=2"),
        ((Gres("gpu", "a100", 1), Gres("shard", "g2", 3)), "", True, "gres/gpu:a100=1,gres/shard:g2=3"),
        ((), "", False, ""),
    ],
)
def test_every_form_is_written_and_reads_back(items: tuple[Gres, ...], prefix: str, tres: bool, text: str) -> None:
    assert write_gres(items, prefix=prefix, tres=tres) == text
    assert parse_gres(write_gres(items, prefix=prefix, tres=tres)) == items


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ("gpu:g1:1(IDX:1),gpu:g3:1(IDX:3)", {"gpu": (1, 3)}),
        ("gpu:2(IDX:0-1)", {"gpu": (0, 1)}),
        ("gpu:(null):3(IDX:0,2-3)", {"gpu": (0, 2, 3)}),
        ("gpu:g0:1(IDX:0),gpu:g1:0(IDX:),gpu:g2:1(IDX:2)", {"gpu": (0, 2)}),
        ("shard:g0:1(IDX:0),shard:g2:1(IDX:2)", {"shard": (0, 2)}),
        ("gpu:g0:1(IDX:0),shard:g3:1(IDX:3)", {"gpu": (0,), "shard": (3,)}),
        ("shard:g2:1(2/2)", {"shard": (2,)}),
        ("gpu:g1:0(IDX:N/A)", {}),
        ("", {}),
    ],
)
def test_gres_detail(detail: str, expected: dict[str, tuple[int, ...]]) -> None:
    assert parse_gres_detail(detail) == expected


def test_gres_requests() -> None:
    assert requested_gres("gres:gpu:g1:1,gres:gpu:g3:1") == {("gpu", "g1"), ("gpu", "g3")}
    assert requested_gres("gres/shard:g2:1") == {("shard", "g2")}
    assert requested_gres("gpu:g1:0,gpu:g2:1") == {("gpu", "g2")}
    assert requested_gres("gres/gpu:2") == {("gpu", "")}
    assert requested_gres("") == frozenset()
    assert typed_indices("gres:gpu:g0:1,gres:gpu:2,gres:shard:g3:1,gres:gpu:g5:0") == {0, 3}


@pytest.mark.parametrize(
    "gres,n",
    [
        ("gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2", 2),
        ("gpu:4(S:0-1)", 4),
        ("", 0),
        ("(null)", 0),
        ("gpu:tesla:2,mps:100", 2),
    ],
)
def test_gres_gpu_count(gres: str, n: int) -> None:
    assert gres_gpu_count(gres) == n


def test_per_gpu_types() -> None:
    assert (gpu_index("g3"), gpu_index("g12"), gpu_index("a100"), gpu_index("")) == (3, 12, None, None)
    assert node_gpus("gpu:g0:1,gpu:g1:1(S:0),shard:g0:2,gpu:g3:1") == (0, 1, 3)
    assert node_gpus("gpu:a100:4") == ()
    assert parse_index_spec("0-1,3") == (0, 1, 3) and parse_index_spec("N/A") == ()


def test_gres_strings() -> None:
    assert typed_gres((2, 0)) == "gpu:g0:1,gpu:g2:1"
    assert typed_gres([1], shared=True) == "shard:g1:1"
    with pytest.raises(BadRequest, match="at least one GPU"):
        typed_gres(())
    assert placement_gres(Placement((GpuRef("n2", 3), GpuRef("n2", 1)))) == ("n2", "gpu:g1:1,gpu:g3:1")
    assert placement_gres(Placement((GpuRef("n1", 0), GpuRef("n2", 0)), shared=True)) == ("n1,n2", "shard:g0:1")
    with pytest.raises(BadRequest, match="different GPU indices"):
        placement_gres(Placement((GpuRef("n1", 0), GpuRef("n2", 1))))
