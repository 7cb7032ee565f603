"""ParallelDims: degrees that multiply to the world size, and the DeviceMesh they build."""

import pytest

from multirank import run_ranks
from trainkit.parallel import MESH_DIMS, ParallelDims


def test_one_degree_is_inferred_from_the_world_size():
    assert ParallelDims().resolve(4) == ParallelDims(replicate=1, shard=4, tensor=1)
    assert ParallelDims(replicate=2, tensor=2).resolve(8).shard == 2
    assert ParallelDims(replicate=-1, shard=2).resolve(8).replicate == 4
    dims = ParallelDims(replicate=1, shard=2, tensor=2)
    assert (dims.data_parallel, [dims.data_parallel_rank(r) for r in range(4)]) == (2, [0, 0, 1, 1])


def test_degrees_that_do_not_multiply_to_the_world_size():
    with pytest.raises(ValueError) as caught:
        ParallelDims(replicate=3, shard=1, tensor=1).resolve(4)
    assert str(caught.value) == (
        "ParallelDims pipeline=1 x replicate=3 x shard=1 x context=1 x tensor=1 = 3 ranks, but "
        "the world "
        "size is 4; "
        "the degrees must multiply to the world size (each degree must be one of [1, 2, 4])"
    )
    with pytest.raises(
        ValueError, match=r"cannot infer ParallelDims shard: the other degrees \(3\)"
    ):
        ParallelDims(replicate=3).resolve(4)
    with pytest.raises(ValueError, match="ParallelDims shard=0 is not a degree"):
        ParallelDims(shard=0)
    with pytest.raises(ValueError, match="ParallelDims tensor=True is not a degree"):
        ParallelDims(tensor=True)
    with pytest.raises(ValueError, match=r"can infer one degree, but \['replicate', 'shard'\]"):
        ParallelDims(replicate=-1, shard=-1)


def _mesh(rank, world):
    mesh = ParallelDims(replicate=2, shard=1, tensor=2).build_mesh("cpu", world)
    return mesh.mesh_dim_names, tuple(mesh.shape), tuple(mesh.get_coordinate())


def test_mesh_puts_tensor_parallel_ranks_next_to_each_other():
    results = run_ranks(_mesh, 4)
    assert {names for names, _, _ in results} == {MESH_DIMS}
    assert {shape for _, shape, _ in results} == {(1, 2, 1, 1, 2)}
    assert [coordinate for _, _, coordinate in results] == [
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 1, 0, 0, 0), (0, 1, 0, 0, 1),
    ]  # fmt: skip
