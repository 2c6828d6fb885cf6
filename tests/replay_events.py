"""The events the estimate's replay of the caching allocator runs, recorded for a test."""

from compiler.memory.allocator import Allocator


def played(monkeypatch) -> list:
    """The (key, bytes) events the estimate's replay runs in the formulas' order, in order
    (bytes None: a free), recorded while `monkeypatch` holds Allocator.play (and
    replay.ORDERS cut to the formulas' order: no other orders beside it)."""
    from compiler.pipeline import replay

    monkeypatch.setattr(replay, "ORDERS", replay.ORDERS[:1])
    events: list = []
    play = Allocator.play

    def recording(self, batch, made, probe_key):
        batch = list(batch)
        events.extend(batch)
        return play(self, batch, made, probe_key)

    monkeypatch.setattr(Allocator, "play", recording)
    return events
