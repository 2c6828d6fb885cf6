"""A GPU's own allocation history (torch.cuda.memory's trace) replayed through the caching
allocator model: worked sequences whose real reservations are known from the allocator's rules
(c10/cuda/CUDACachingAllocator.cpp: 2 MiB small-pool segments, 20 MiB large-pool segments for
requests under 10 MiB, a request of 10 MiB or more its own segment rounded to 2 MiB)."""

from compiler.measure import history

MIB = 2**20


def _snapshot(entries):
    return {"segments": [], "device_traces": [[{"action": a, "addr": addr, "size": size, "stream": 0} for a, addr, size in entries]]}


def test_events_keep_allocs_completed_frees_and_segments_in_order():
    snap = _snapshot(
        [
            ("segment_alloc", 0, 20 * MIB),
            ("alloc", 0, 3 * MIB),
            ("free_requested", 0, 3 * MIB),
            ("free_completed", 0, 3 * MIB),
            ("snapshot", 0, 0),
            ("oom", 0, 0),
        ]
    )
    assert history.events(snap) == [("segment_alloc", 0, 20 * MIB), ("alloc", 0, 3 * MIB), ("free_completed", 0, 3 * MIB)]
    assert history.events(snap, index=1) == []  # no trace for a device that made none


def test_write_and_read_give_back_the_same_events(tmp_path):
    events = [("segment_alloc", 1 << 40, 2 * MIB), ("alloc", 1 << 40, 512), ("free_completed", 1 << 40, 512)]
    history.write(tmp_path / "h.jsonl.gz", events)
    assert history.read(tmp_path / "h.jsonl.gz") == events


def test_the_model_reserves_what_the_gpu_did_for_the_same_sequence():
    """Two 3 MiB blocks share one 20 MiB segment; a 16 MiB block, larger than the 14 MiB left
    there, gets its own 16 MiB segment; a 512-byte one a 2 MiB small-pool segment; once the
    16 MiB block is freed, a 13 MiB one is served from it (best fit, the 3 MiB rest split off).
    GPU reserved peak 20 + 16 + 2 = 38 MiB; live blocks at most 3 + 3 + 16 MiB + 512 B."""
    a, c, d, e = (i << 30 for i in range(1, 5))
    gpu = [
        ("segment_alloc", a, 20 * MIB),
        ("alloc", a, 3 * MIB),
        ("alloc", a + 3 * MIB, 3 * MIB),
        ("segment_alloc", c, 16 * MIB),
        ("alloc", c, 16 * MIB),
        ("segment_alloc", d, 2 * MIB),
        ("alloc", d, 512),
        ("free_completed", c, 16 * MIB),
        ("alloc", c, 13 * MIB),
        ("free_completed", a, 3 * MIB),
        ("free_completed", e, 512),  # e: a block from before the history
    ]
    r = history.replay(gpu)
    assert (r.gpu_reserved, r.model_reserved) == (38 * MIB, 38 * MIB) and r.error_pct == 0.0
    assert r.gpu_allocated == r.model_allocated == 22 * MIB + 512
    assert (r.allocations, r.unmatched_frees) == (5, 1)


def test_a_sequence_the_model_reserves_differently_shows_its_error():
    """Had the GPU grown a fresh segment where the model reuses a cached block, the replay says
    so: here the GPU's trace claims a second 12 MiB segment the rules would not make."""
    gpu = [
        ("segment_alloc", 1 << 30, 12 * MIB),
        ("alloc", 1 << 30, 12 * MIB),
        ("free_completed", 1 << 30, 12 * MIB),
        ("segment_alloc", 2 << 30, 12 * MIB),
        ("alloc", 2 << 30, 12 * MIB),
    ]
    r = history.replay(gpu)
    assert (r.gpu_reserved, r.model_reserved) == (24 * MIB, 12 * MIB) and r.error_pct == -50.0


def test_main_prints_one_line_per_history(tmp_path, capsys):
    history.write(tmp_path / "a.history.jsonl.gz", [("segment_alloc", 0, 2 * MIB), ("alloc", 0, 512)])
    assert history.main([str(tmp_path / "a.history.jsonl.gz")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("a.history.jsonl.gz: 1 allocations; GPU reserved 0.00 GiB") and "(+0.00 %)" in out
    assert history.main([]) == 2
