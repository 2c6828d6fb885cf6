"""The events the estimate's replay of the caching allocator runs, recorded for a test."""

from compiler.memory.allocator import Allocator


def played(monkeypatch) -> list:
    """The (key, bytes) events the estimate's replay runs in the formulas' order, in order
    (bytes None: a free), with their keys as the walk made them (the replay plays them
    numbered, replay._Keys), recorded while `monkeypatch` holds Allocator.play (and
    replay.ORDERS cut to the formulas' order: no other orders beside it; no replay
    answered from replay's memory of earlier ones)."""
    from compiler.pipeline import replay

    monkeypatch.setattr(replay, "ORDERS", replay.ORDERS[:1])
    monkeypatch.setattr(replay, "REMEMBERED", 0)  # NB: every estimate replays, none answers from memory
    events: list = []
    keys: list = []  # the replay's numbering of the estimate running now
    play, numbered = Allocator.play, replay._Keys.numbered

    def numbering(self, batch):
        keys[:] = [self]
        return numbered(self, batch)

    def recording(self, batch, made, probe_key):
        batch = list(batch)
        events.extend(keys[0].named(batch))
        return play(self, batch, made, probe_key)

    monkeypatch.setattr(replay._Keys, "numbered", numbering)
    monkeypatch.setattr(Allocator, "play", recording)
    return events
