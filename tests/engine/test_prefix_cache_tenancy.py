"""The prefix cache scoped to its tenant: identical tokens of two tenants never share a block, a
tenant's own repeats still do, and only a staff-marked shared prefix is everyone's. Without a model:
the block manager and the scheduler report what ``cached_tokens`` would."""

import math

import pytest

from engine.errors import InvalidParameterError
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.sequence import Sequence
from engine.tenancy import Tenant

BS = 4
SECRET = list(range(100, 117))  # 4 full blocks and the last token


def seq(rid, tokens, tenant="", shared=0):
    return Sequence(rid, tokens, SamplingParams(max_tokens=8), tenant=Tenant(tenant), shared_prefix_len=shared)


def computed(bm, s):
    """Compute ``s``'s whole prompt and publish its full blocks, as a step does."""
    assert bm.allocate(s, s.num_tokens)
    s.num_computed_tokens = s.num_tokens
    bm.cache_full_blocks(s)
    return s


def test_same_tokens_of_two_tenants_share_no_block():
    bm = BlockManager(num_blocks=20, block_size=BS)
    computed(bm, seq("a", SECRET, "user:1"))

    assert bm.get_computed_blocks(seq("b", SECRET, "user:2")) == []
    assert bm.get_computed_blocks(seq("engine-alone", SECRET, "")) == []  # "" is a tenant like any other


def test_same_tokens_of_one_tenant_share_its_blocks():
    bm = BlockManager(num_blocks=20, block_size=BS)
    first = computed(bm, seq("a", SECRET, "user:1"))

    assert bm.get_computed_blocks(seq("a2", SECRET, "user:1")) == first.block_table[:4]


def test_blocks_inside_the_shared_prefix_are_everyones_and_the_rest_stays_the_tenants():
    bm = BlockManager(num_blocks=20, block_size=BS)
    system = list(range(10))  # 2 full blocks, then half of the third
    a = computed(bm, seq("a", system + [50, 51, 52, 53, 54, 55, 56], "user:1", shared=len(system)))

    b_hits = bm.get_computed_blocks(seq("b", system + [50, 51, 52, 53, 54, 55, 56], "user:2", shared=len(system)))
    a_hits = bm.get_computed_blocks(seq("a2", system + [50, 51, 52, 53, 54, 55, 56], "user:1", shared=len(system)))

    assert b_hits == a.block_table[:2]  # the block straddling the prefix's end is private
    assert a_hits == a.block_table[:4]
    # The same tokens without the mark chain from the tenant's salt: no public block is hit.
    assert bm.get_computed_blocks(seq("c", system + [60], "user:3")) == []


def test_a_shared_prefix_hits_only_when_the_tokens_are_equal():
    bm = BlockManager(num_blocks=20, block_size=BS)
    computed(bm, seq("a", list(range(9)), "user:1", shared=8))

    assert len(bm.get_computed_blocks(seq("b", list(range(9)), "user:2", shared=8))) == 2
    assert bm.get_computed_blocks(seq("b", [99] + list(range(1, 9)), "user:2", shared=8)) == []


def test_private_tail_of_a_shared_prefix_differs_between_tenants_block_by_block():
    bm = BlockManager(num_blocks=20, block_size=BS)
    one = seq("a", list(range(17)), "user:1", shared=8)
    two = seq("b", list(range(17)), "user:2", shared=8)

    h1, h2 = bm.full_block_hashes(one), bm.full_block_hashes(two)

    assert h1[:2] == h2[:2] and all(x != y for x, y in zip(h1[2:], h2[2:]))


def probe_cached_tokens(*, tenant_of_a, tenant_of_b, a_sends_first):
    """B's right and wrong guesses of the word in A's prompt, as ``cached_tokens`` reports them."""
    s = Scheduler(BlockManager(num_blocks=40, block_size=BS), max_num_seqs=8, max_num_batched_tokens=64)

    def cached_tokens(rid, tokens, tenant):
        request = seq(rid, tokens, tenant)
        s.add(request)
        out = s.schedule()
        s.update_after_step(out)
        s.remove(request)
        return request.num_cached_tokens

    record = [1, 2, 3, 4, 5, 6, 7, 8, 42, 43, 44, 45, 9]  # 42..45: the private word
    if a_sends_first:
        cached_tokens("a", record, tenant_of_a)
    return [cached_tokens("b-wrong", record[:8] + [77, 78, 79, 80, 10], tenant_of_b),
            cached_tokens("b-right", record[:8] + [42, 43, 44, 45, 11], tenant_of_b),
            cached_tokens("a-again", record + [0], tenant_of_a)]


def test_cached_tokens_reveal_nothing_of_another_tenants_prompt():
    """The attack, through the scheduler: what B reads is the same whether or not A sent its record."""
    after_a = probe_cached_tokens(tenant_of_a="user:1", tenant_of_b="user:2", a_sends_first=True)
    without_a = probe_cached_tokens(tenant_of_a="user:1", tenant_of_b="user:2", a_sends_first=False)
    unscoped = probe_cached_tokens(tenant_of_a="", tenant_of_b="", a_sends_first=True)

    assert after_a[:2] == without_a[:2] == [0, 8]  # 8: B's own first two blocks, from its wrong guess
    assert after_a[2] == 12  # A's repeat still hits its own three blocks
    assert unscoped[:2] == [8, 12]  # one tenant for all: the right guess reads one block more


def test_forked_samples_keep_their_requests_tenant():
    from engine.sampling.parallel_sampling import fork

    bm = BlockManager(num_blocks=20, block_size=BS)
    parent = computed(bm, seq("a", SECRET, "user:1"))
    child = seq("a#1", SECRET, "user:1")
    fork(parent, child, bm)
    child.num_computed_tokens = child.num_tokens
    bm.cache_full_blocks(child)

    assert child.block_hashes == bm.full_block_hashes(seq("a2", SECRET, "user:1"))


@pytest.mark.parametrize("kwargs,param", [
    (dict(id=3), "tenant.id"), (dict(id=None), "tenant.id"),
    (dict(weight=0), "tenant.weight"), (dict(weight=-1.0), "tenant.weight"),
    (dict(weight=math.nan), "tenant.weight"), (dict(weight=math.inf), "tenant.weight"),
    (dict(weight=True), "tenant.weight"), (dict(weight="2"), "tenant.weight"),
])
def test_a_bad_tenant_names_its_field(kwargs, param):
    with pytest.raises(InvalidParameterError) as e:
        Tenant(**kwargs)
    assert e.value.param == param


def test_a_tenant_is_a_frozen_value():
    assert Tenant("user:1", 2) == Tenant("user:1", 2.0) and Tenant() == Tenant("", 1.0)
    with pytest.raises(AttributeError):
        Tenant().id = "user:2"


_HASHES_OF_A_PROCESS = """
from engine.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager, hash_block_tokens, tenant_salted
from engine.scheduling.sequence import Sequence
from engine.tenancy import Tenant
seq = Sequence("r", list(range(40)), SamplingParams(), tenant=Tenant("user:7"), shared_prefix_len=16)
hashes = BlockManager(8, 16).full_block_hashes(seq)
public = hash_block_tokens(0, list(range(16)))  # what a known root (0) would give
print(hashes[0] != public, hashes[1] != hash_block_tokens(tenant_salted(public, "user:7"), list(range(16, 32))),
      hashes == BlockManager(8, 16).full_block_hashes(seq), hashes[0], hashes[1])
"""


def test_block_hashes_root_in_a_secret_of_the_process_not_a_known_constant():
    """xxh3 is not collision resistant: with a known root a tenant could craft a prompt whose blocks
    hash like a shared block's offline (vLLM CVE-2025-25183). The public root is a random secret per
    process: the hashes are stable within it, differ between processes, and match no known root."""
    import subprocess
    import sys

    runs = [subprocess.run([sys.executable, "-c", _HASHES_OF_A_PROCESS], capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    for run in runs:
        assert run[:3] == ["True", "True", "True"]
    assert runs[0][3] != runs[1][3] and runs[0][4] != runs[1][4]
