"""compiler/memory/allocator.py against its earlier implementation (tests/allocator_reference.py)
on many random sequences of allocations, frees and probes, under the default configuration
(the inlined path) and others: every return value, counter, peak, out-of-memory and the
free blocks of each pool agree after every operation."""

import random

import pytest

from compiler.memory import allocator as fast
from compiler.memory.allocator import MIB

import allocator_reference as ref  # noqa: E402  (tests/ is on sys.path under pytest's rootdir conftest)

# NB: expandable segments are not compared: the reference predates their get_free_block,
# empty_cache and address-space rules; tests/test_measure_history.py holds them to the GPU's
# own histories instead, to the byte
CONFS = [
    "",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
    "max_split_size_mb:32,roundup_power2_divisions:[256:2,>:8]",
]


def _state(a):
    pools = [
        (tuple(p.entries() if hasattr(p, "entries") else p.order), sorted((b.ptr, b.size, b.allocated) for b in p.free.values())) for p in (a._small, a._large)
    ]
    return (a.allocated, a.reserved, a.peak_allocated, a.peak_reserved, a.mallocs, pools)


def _sizes(rng):
    kind = rng.random()
    if kind < 0.4:
        return rng.randint(1, 1 << 20)
    if kind < 0.8:
        return rng.randint(1 << 20, 64 * MIB)
    return rng.choice([512, 2 * MIB, 10 * MIB, 20 * MIB, 3 * 1024**3 // 7])


def _run(seed: int, conf: str, capacity):
    rng = random.Random(seed)
    a = fast.Allocator(fast.AllocatorConfig.parse(conf) if conf else fast.AllocatorConfig(), capacity)
    b = ref.Allocator(ref.AllocatorConfig.parse(conf) if conf else ref.AllocatorConfig(), capacity)
    live = []
    for step in range(600):
        op = rng.random()
        if op < 0.5 or not live:
            key, n = ("t", step), _sizes(rng)
            outcome = []
            for alloc in (a, b):
                try:
                    outcome.append(("ok", alloc.malloc(key, n)))
                except Exception as exc:  # noqa: BLE001  (out of memory: compared by message)
                    outcome.append((type(exc).__name__, str(exc)))
            assert outcome[0] == outcome[1], (seed, conf, step)
            if outcome[0][0] != "ok":
                return
            live.append(key)
        elif op < 0.9:
            key = live.pop(rng.randrange(len(live)))
            a.free(key)
            b.free(key)
        elif op < 0.97:
            n = _sizes(rng)
            outcome = []
            for alloc in (a, b):
                try:
                    alloc.probe(n)
                    outcome.append("ok")
                except Exception as exc:  # noqa: BLE001
                    outcome.append(str(exc))
            assert outcome[0] == outcome[1]
            if outcome[0] != "ok":
                return
        else:
            assert a.empty_cache() == b.empty_cache()
        assert _state(a) == _state(b), (seed, conf, step)


@pytest.mark.parametrize("conf", CONFS)
def test_same_as_reference_on_random_sequences(conf):
    for seed in range(40):
        _run(seed, conf, None if seed % 3 == 0 else (1 + seed % 7) * 256 * MIB)


def test_replay_same_as_reference():
    rng = random.Random(7)
    events, live = [], []
    for step in range(5000):
        if live and rng.random() < 0.45:
            events.append((live.pop(rng.randrange(len(live))), None))
        else:
            live.append(step)
            events.append((step, _sizes(rng)))
    for conf in CONFS:
        config_a = fast.AllocatorConfig.parse(conf) if conf else fast.AllocatorConfig()
        config_b = ref.AllocatorConfig.parse(conf) if conf else ref.AllocatorConfig()
        for capacity in (None, 8 * 1024**3, 40 * 1024**3):
            x, y = fast.replay(events, config_a, capacity), ref.replay(events, config_b, capacity)
            assert (x.peak_allocated, x.peak_reserved) == (y.peak_allocated, y.peak_reserved)
            assert (x.oom is None) == (y.oom is None)
            if x.oom is not None:
                assert x.oom.__dict__ == y.oom.__dict__


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
@pytest.mark.parametrize("capacity", [None, 3 * 1024**3])
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_play_with_probes_same_as_one_operation_at_a_time(capacity, conf, seed):
    """`play`'s probe under the default configuration (answered from the pool's largest free
    block where one fits) leaves the allocator as `probe` does, and its own malloc under
    expandable segments (best fit taking the block that can grow least, a split keeping 512 B
    or more) as `malloc`'s general path does, which the GPU histories hold to the byte: the
    same events, one batch against malloc, free and probe called one at a time; on a 4 GiB
    device under expandable segments, the mappings, their release and an out-of-memory too."""
    rng = random.Random(seed)
    probe = ("probe",)
    events, live = [], []
    for step in range(4000):
        op = rng.random()
        if live and op < 0.4:
            events.append((live.pop(rng.randrange(len(live))), None))
        elif op < 0.6:
            events.append((probe, _sizes(rng)))
        else:
            live.append(("t", step))
            events.append((live[-1], _sizes(rng)))
    config = fast.AllocatorConfig.parse(conf) if conf else fast.AllocatorConfig()
    batch, single = (fast.Allocator(config, capacity, 4 * 1024**3 if conf else None) for _ in range(2))
    try:
        batch.play(events, [], probe)
        batch_oom = None
    except fast.OutOfMemoryError as exc:
        batch_oom = exc.oom
    single_oom = None
    for key, n in events:
        try:
            if n is None:
                single.free(key)
            elif key is probe:
                single.probe(n)
            else:
                single.malloc(key, n)
        except fast.OutOfMemoryError as exc:
            single_oom = exc.oom
            break
    assert batch_oom == single_oom
    assert _state(batch) == _state(single)
